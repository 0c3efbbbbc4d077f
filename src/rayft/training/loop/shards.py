"""Which rows of the prepared files each worker trains on (a pure planner), and reading them.

Every rank gets the same number of units, as one contiguous run of rows across the files, so
no rank waits for another at an epoch's end and the assignment is identical whether the loop
runs on Ray Train, under torchrun, or in-process. Each rank reads its own rows from the prepared
Parquet files itself, one row group at a time, on every runtime: the driver reads no training
data, and no copy of a split goes through Ray's object store.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayft.errors import DataError


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


def check_readable(files: Mapping[str, Sequence[str]], rank: int) -> None:
    """Fail at once, naming the first prepared file that rank ``rank`` cannot open on its node: a
    worker on a node that does not mount the data cache would otherwise fail at its first batch."""
    for paths in files.values():
        for path in paths:
            if not os.access(path, os.R_OK):
                raise DataError(
                    f"data: rank {rank} on node {socket.gethostname()} cannot read the prepared file {path}; "
                    "every worker reads its rows itself, so on a cluster of more than one node put the data "
                    "cache (data.cache_dir or $RAYFT_DATA_CACHE; a custom task's units live there too) on a file "
                    "system that every node mounts at the same path"
                )


def iter_shard_tables(files: Sequence[str], ranges: Sequence[RowRange]) -> Iterator[Any]:
    """The rows of a shard's row ranges, in order, as Arrow tables of at most one Parquet row group
    each: a rank holds one row group and its windows, never its shard or the split."""
    import pyarrow.parquet as pq

    for run in ranges:
        with pq.ParquetFile(files[run.file]) as parquet:
            first = 0  # the row group's first row in the file
            for group in range(parquet.metadata.num_row_groups):
                count = parquet.metadata.row_group(group).num_rows
                low, high = max(run.start, first), min(run.stop, first + count)
                if low < high:
                    yield parquet.read_row_group(group).slice(low - first, high - low)
                first += count
                if first >= run.stop:
                    break


def iter_rank_tables(files: Sequence[str], rank: int, world_size: int) -> Iterator[Any]:
    """Rank ``rank``'s planned shard (:func:`plan_shards`) of ``files``, read as it is consumed
    (:func:`iter_shard_tables`)."""
    return iter_shard_tables(files, plan_shards(parquet_row_counts(files), world_size)[rank])


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
