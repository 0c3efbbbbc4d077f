"""The SDG output directory: per-batch part files committed by rename, and resume from them.

Layout of ``<output_dir>``::

    state.json                      the config hash the rows were made with
    parts/part-000001.accepted.parquet
    parts/part-000001.rejected.parquet
    parts/part-000001.done.json     written last: the part's seed ids and counts (its commit marker)
    data.parquet, data.jsonl        every accepted row (rebuilt from the parts at the end)
    rejected.jsonl                  every rejected row with its stage, reason and detail
    summary.json

A part without its ``done.json`` was cut short by a crash and is deleted on the next start; the
seeds of committed parts are skipped, so a rerun neither repeats nor duplicates rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from rayft.errors import RunStateError, StorageError
from rayft.files import write_atomic, write_text_atomic
from rayft.sdg.rows import OUTPUT_COLUMNS, ROW_DEFAULTS
from rayft.sdg.stages import Row
from rayft.security import redact

_DONE = re.compile(r"^part-(\d{6})\.done\.json$")
CONSOLIDATE_BATCH_ROWS = 8192  # rows read, converted and written at a time when the parts are joined


class SdgStore:
    """Reads and writes one SDG output directory."""

    def __init__(self, root: Path, extra_columns: tuple[str, ...] = ()) -> None:
        """``extra_columns``: text columns written after the usual ones (the tool-use traces' messages and tools)."""
        if "://" in str(root):
            raise StorageError(f"sdg output_dir {str(root)!r}: only local (or mounted) directories are supported")
        self.root = root
        self.parts = root / "parts"
        self.data_parquet = root / "data.parquet"
        self.data_jsonl = root / "data.jsonl"
        self.rejected_jsonl = root / "rejected.jsonl"
        self.summary_json = root / "summary.json"
        self.columns = (*OUTPUT_COLUMNS, *extra_columns)

    def open(self, config_hash: str) -> None:
        """Create the directory, or reopen it for resume when it was made with the same config.

        Raises:
            RunStateError: the directory holds rows made with another SDG config.
        """
        try:
            self.parts.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the sdg output directory {self.root}: {exc}") from exc
        state_path = self.root / "state.json"
        if state_path.exists():
            previous = json.loads(state_path.read_text()).get("config_hash")
            if previous != config_hash and self.done_records():
                raise RunStateError(
                    f"{self.root} holds synthetic rows made with another sdg config (hash {previous}, now "
                    f"{config_hash}); set sdg.output_dir to a new directory, or delete {self.root} to start over"
                )
        write_text_atomic(state_path, json.dumps({"config_hash": config_hash}) + "\n")
        self._remove_uncommitted()

    def _remove_uncommitted(self) -> None:
        committed = {m.group(1) for p in self.parts.iterdir() if (m := _DONE.match(p.name))}
        for path in self.parts.iterdir():
            number = path.name[5:11] if path.name.startswith("part-") else ""
            if path.name.startswith(".") or number not in committed:
                path.unlink()

    def done_records(self) -> list[dict[str, Any]]:
        """The commit records of every committed part, in part order."""
        if not self.parts.exists():
            return []
        paths = sorted(p for p in self.parts.iterdir() if _DONE.match(p.name))
        return [json.loads(p.read_text()) for p in paths]

    def done_seeds(self) -> set[str]:
        """Seed ids whose rows are all committed."""
        return {s for record in self.done_records() for s in record["seed_ids"]}

    def next_part(self) -> int:
        """The number of the next part to write."""
        numbers = [int(m.group(1)) for p in self.parts.iterdir() if (m := _DONE.match(p.name))]
        return max(numbers, default=0) + 1

    def committed_accepted(self) -> Iterator[Row]:
        """Accepted rows of every committed part (to rebuild the dedup indexes on resume)."""
        import pyarrow.parquet as pq

        for record in self.done_records():
            path = self.parts / f"part-{record['part']:06d}.accepted.parquet"
            if path.exists():
                yield from pq.read_table(path, columns=["question", "seed_id"]).to_pylist()

    def commit_part(self, number: int, accepted: list[Row], rejected: list[Row], record: dict[str, Any]) -> None:
        """Write one part's rows, then its commit record (last, by rename)."""
        stem = self.parts / f"part-{number:06d}"
        for kind, rows in (("accepted", accepted), ("rejected", rejected)):
            if rows:
                table = _table(rows, self.columns)
                write_atomic(Path(f"{stem}.{kind}.parquet"), partial(_write_parquet, table))
        write_text_atomic(Path(f"{stem}.done.json"), json.dumps({**record, "part": number}) + "\n")

    def consolidate(self) -> tuple[int, int]:
        """Rebuild data.parquet, data.jsonl and rejected.jsonl from the committed parts, a batch of
        rows at a time (never the whole output in memory); the row counts."""
        accepted, rejected = self._part_paths("accepted"), self._part_paths("rejected")
        write_atomic(self.data_parquet, partial(_write_parquet_parts, accepted, self.columns))
        write_atomic(self.data_jsonl, partial(_write_jsonl_parts, accepted))
        write_atomic(self.rejected_jsonl, partial(_write_jsonl_parts, rejected))
        return sum(map(_num_rows, accepted)), sum(map(_num_rows, rejected))

    def _part_paths(self, kind: str) -> list[Path]:
        """The committed parts' files of ``kind`` (accepted or rejected), in part order."""
        numbers = sorted(int(m.group(1)) for p in self.parts.iterdir() if (m := _DONE.match(p.name)))
        paths = [self.parts / f"part-{number:06d}.{kind}.parquet" for number in numbers]
        return [path for path in paths if path.exists()]


def _num_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _part_batches(paths: list[Path]) -> Iterator[Any]:
    """The record batches of the part files, one at a time."""
    import pyarrow.parquet as pq

    for path in paths:
        yield from pq.ParquetFile(path).iter_batches(batch_size=CONSOLIDATE_BATCH_ROWS)


def _write_parquet_parts(paths: list[Path], columns: tuple[str, ...], path: Path) -> None:
    """One Parquet file of the parts' rows, written a row group of about ``CONSOLIDATE_BATCH_ROWS``
    rows at a time (small parts are joined into one row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _table([], columns).schema
    held: list[Any] = []
    with pq.ParquetWriter(path, schema) as writer:
        for batch in _part_batches(paths):
            held.append(batch.cast(schema))
            if sum(b.num_rows for b in held) >= CONSOLIDATE_BATCH_ROWS:
                writer.write_table(pa.Table.from_batches(held, schema))
                held.clear()
        if held:
            writer.write_table(pa.Table.from_batches(held, schema))


def _write_jsonl_parts(paths: list[Path], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for batch in _part_batches(paths):
            for row in batch.to_pylist():
                f.write(redact(json.dumps(row, ensure_ascii=False)) + "\n")


def _table(rows: list[Row], names: tuple[str, ...] = OUTPUT_COLUMNS) -> Any:
    import pyarrow as pa

    columns = {c: [r.get(c, ROW_DEFAULTS.get(c, "")) for r in rows] for c in names}
    schema = pa.schema([(c, pa.int64() if isinstance(ROW_DEFAULTS.get(c), int) else pa.string()) for c in names])
    return pa.table(columns, schema=schema)


def _write_parquet(table: Any, path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path)
