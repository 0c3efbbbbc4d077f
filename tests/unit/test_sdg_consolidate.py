"""SDG consolidation joins the committed parts a batch at a time, into the rows a whole-table
concatenation gives, in part order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayft.sdg import store as store_module
from rayft.sdg.rows import ROW_DEFAULTS
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import part_record


def _row(seed: str, variation: int, **kw: Any) -> dict[str, Any]:
    return {**ROW_DEFAULTS, "seed_id": seed, "variation": variation, "id": f"{seed}-{variation}", **kw}


def test_consolidation_streams_the_parts_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "CONSOLIDATE_BATCH_ROWS", 4)
    store = SdgStore(tmp_path / "out")
    store.open("h")
    for part in (1, 2, 3):
        accepted = [_row(f"s{part}", v, question=f"q{part}.{v} é", answer=str(v)) for v in range(5 + part)]
        rejected = [_row(f"s{part}", 99, reject_stage="quality", reject_reason="r")] if part != 2 else []
        store.commit_part(part, accepted, rejected, part_record(accepted + rejected, [f"s{part}"], {}))
    assert store.consolidate() == (6 + 7 + 8, 2)
    parts = [pq.read_table(p) for p in sorted(store.parts.glob("*.accepted.parquet"))]
    whole = pa.concat_tables(parts)
    written = pq.ParquetFile(store.data_parquet)
    assert written.read().equals(whole)
    assert written.metadata.num_row_groups > 3  # a row group per batch of 4, not one table
    lines = store.data_jsonl.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == whole.to_pylist()
    assert [json.loads(line)["id"] for line in store.rejected_jsonl.read_text().splitlines()] == ["s1-99", "s3-99"]


def test_consolidation_of_no_parts_writes_empty_files(tmp_path: Path) -> None:
    store = SdgStore(tmp_path / "out")
    store.open("h")
    assert store.consolidate() == (0, 0)
    assert pq.read_table(store.data_parquet).num_rows == 0
    assert store.data_jsonl.read_text() == store.rejected_jsonl.read_text() == ""
