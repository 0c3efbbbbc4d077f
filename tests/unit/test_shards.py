"""The shard plan: equal, contiguous, deterministic, the same on every runtime."""

from __future__ import annotations

from pathlib import Path

from rayft.training.loop.shards import iter_windows, parquet_row_counts, plan_shards, read_shard_tables


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
    windows = list(iter_windows(read_shard_tables(files, rank1), 3))
    assert [[row["id"] for row in w] for w in windows] == [[4, 5, 6], [7]]
