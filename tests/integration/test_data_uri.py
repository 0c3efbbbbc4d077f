"""Datasets on an object store (the moto S3 server) are read as they stream: JSON Lines a line at a time, so a
bad line is one rejected row, and Parquet a batch at a time; no row name or error carries the URI's
credentials."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rayft.config import DatasetConfig
from rayft.errors import DataError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3_server() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    from tests.support.object_store import local_s3_server

    with local_s3_server() as server:
        yield server


def _put(uri: str, name: str, data: bytes) -> str:
    import pyarrow.fs as pafs

    filesystem, root = pafs.FileSystem.from_uri(uri)
    with filesystem.open_output_stream(f"{root}/{name}") as out:
        out.write(data)
    base, query = uri.split("?", 1)
    return f"{base}/{name}?{query}"


def test_json_lines_and_parquet_on_s3_stream_with_bad_lines_rejected_and_credentials_masked(s3_server: Any) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayft.data.read.rows import iter_rows
    from tests.support.object_store import DUMMY_SECRET_KEY

    bucket = s3_server.bucket_uri("rows")
    jsonl = _put(bucket, "rows.jsonl", b'{"text": "a"}\n{"text": \n{"text": "c"}\n')
    items = list(iter_rows(DatasetConfig(path=jsonl)))
    assert [(i.line, i.reason, i.row) for i in items] == [
        (1, "", {"text": "a"}),
        (2, "bad_json", None),
        (3, "", {"text": "c"}),
    ]
    assert all(DUMMY_SECRET_KEY not in i.file and i.file.endswith("rows/rows.jsonl") for i in items)

    sink = io.BytesIO()
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(10_000)]}), sink, row_group_size=1_000)
    parquet = _put(bucket, "rows.parquet", sink.getvalue())
    texts = [i.row["text"] for i in iter_rows(DatasetConfig(path=parquet, max_rows=2_500)) if i.row is not None]
    assert texts == [f"t{i}" for i in range(2_500)]

    with pytest.raises(DataError) as refused:
        next(iter_rows(DatasetConfig(path=_put(bucket, "x", b"").replace("/x?", "/absent.jsonl?"))))
    assert "absent.jsonl" in str(refused.value) and DUMMY_SECRET_KEY not in str(refused.value)
