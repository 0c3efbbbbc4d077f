"""The shard plan: equal, contiguous, deterministic, the same on every runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.errors import DataError
from rayft.training.loop.shards import (
    check_readable,
    iter_rank_tables,
    iter_shard_tables,
    iter_windows,
    parquet_row_counts,
    plan_shards,
)


def test_every_rank_gets_the_same_number_of_contiguous_rows() -> None:
    shards = plan_shards([5, 3, 4], world_size=2)
    assert shards[0][0].file == 0 and shards[0][0].start == 0
    sizes = [sum(r.stop - r.start for r in ranges) for ranges in shards]
    assert sizes == [6, 6]
    flat = [(r.file, i) for ranges in shards for r in ranges for i in range(r.start, r.stop)]
    assert flat == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (2, 3)]


def test_the_remainder_is_left_out_at_the_end() -> None:
    shards = plan_shards([7], world_size=3)
    assert [[(r.start, r.stop) for r in ranges] for ranges in shards] == [[(0, 2)], [(2, 4)], [(4, 6)]]


def test_reading_a_shard_returns_its_rows_in_windows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for index, rows in enumerate((range(0, 5), range(5, 9))):
        path = tmp_path / f"part-{index}.parquet"
        pq.write_table(pa.table({"id": list(rows)}), path)
        files.append(str(path))
    counts = parquet_row_counts(files)
    assert counts == [5, 4]
    rank1 = plan_shards(counts, 2)[1]
    windows = list(iter_windows(iter_shard_tables(files, rank1), 3))
    assert [[row["id"] for row in w] for w in windows] == [[4, 5, 6], [7]]


def test_a_rank_reads_its_rows_one_row_group_at_a_time(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for index, rows in enumerate((range(0, 23), range(23, 40))):
        path = tmp_path / f"part-{index}.parquet"
        pq.write_table(pa.table({"id": list(rows)}), path, row_group_size=5)
        files.append(str(path))
    for rank in range(3):
        tables = list(iter_rank_tables(files, rank, 3))
        assert all(t.num_rows <= 5 for t in tables)  # never more than one row group at a time
        assert [i for t in tables for i in t.column("id").to_pylist()] == list(range(13 * rank, 13 * rank + 13))


def test_a_prepared_file_a_rank_cannot_read_fails_naming_it_and_the_fix(tmp_path: Path) -> None:
    present = tmp_path / "part-00000.parquet"
    present.write_bytes(b"")
    missing = tmp_path / "elsewhere" / "part-00001.parquet"
    check_readable({"train": [str(present)]}, rank=0)
    with pytest.raises(
        DataError, match=rf"rank 1 on node .* cannot read the prepared file {missing};.*data\.cache_dir"
    ):
        check_readable({"train": [str(present)], "validation": [str(missing)]}, rank=1)
