"""Which rows of the prepared files each worker trains on (a pure planner), and reading them.

Every rank gets the same number of units, as one contiguous run of rows across the files, so
no rank waits for another at an epoch's end and the assignment is identical whether the loop
runs on Ray Train, under torchrun, or in-process.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RowRange:
    """Rows ``[start, stop)`` of file number ``file``."""

    file: int
    start: int
    stop: int


def plan_shards(rows_per_file: Sequence[int], world_size: int) -> list[list[RowRange]]:
    """Split the concatenated rows of the files into ``world_size`` equal contiguous shards.

    The ``sum % world_size`` rows at the end are left out (the schedule reports them).
    """
    per_rank = sum(rows_per_file) // world_size
    offsets = [0]
    for count in rows_per_file:
        offsets.append(offsets[-1] + count)
    shards = []
    for rank in range(world_size):
        begin, end = rank * per_rank, (rank + 1) * per_rank
        ranges = []
        for index, count in enumerate(rows_per_file):
            lo, hi = max(begin, offsets[index]), min(end, offsets[index] + count)
            if lo < hi:
                ranges.append(RowRange(index, lo - offsets[index], hi - offsets[index]))
        shards.append(ranges)
    return shards


def parquet_row_counts(files: Sequence[str]) -> list[int]:
    """Row counts from the parquet footers (no data is read)."""
    import pyarrow.parquet as pq

    return [pq.ParquetFile(f).metadata.num_rows for f in files]


def read_shard_tables(files: Sequence[str], ranges: Sequence[RowRange]) -> list[Any]:
    """The Arrow tables of a shard's row ranges, in order."""
    import pyarrow.parquet as pq

    return [pq.read_table(files[r.file]).slice(r.start, r.stop - r.start) for r in ranges]


def iter_windows(tables: Iterable[Any], window_size: int) -> Iterator[list[dict[str, Any]]]:
    """Rows of ``tables`` as lists of ``window_size`` row dicts (the last may be shorter)."""
    buffer: list[dict[str, Any]] = []
    for table in tables:
        for batch in table.to_batches(max_chunksize=window_size):
            buffer.extend(batch.to_pylist())
            while len(buffer) >= window_size:
                yield buffer[:window_size]
                buffer = buffer[window_size:]
    if buffer:
        yield buffer
