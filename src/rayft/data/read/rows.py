"""The one reader of datasets, row by row (:func:`iter_rows`): every row as a :class:`ReadRow`, with the
file and line it came from, and a row that cannot be read kept as a rejected row instead of refusing its
file. Where the rows are (files, URIs, the Hub, built-in sets) is :mod:`rayft.data.read.sources`; preparation
spills what it reads to disk (:class:`RowStore`, :func:`read_sources`), SDG, the pair maker and
evaluation take the rows as they come.

JSON Lines files are read one line at a time, a JSON array one item at a time, Parquet one batch of
rows at a time, CSV one block of records at a time; no file is ever held whole, and no row of more
than the dataset's ``max_row_bytes`` is parsed whole (it is rejected as ``row_too_large``; a Parquet
cell is measured in Arrow before it becomes a Python object). A line that is not UTF-8
(``bad_encoding``), not JSON or not a JSON object (``bad_json``) becomes a row that holds only its
reason (``UNREADABLE_COLUMN``), so that it is planned, reported in ``rejected.jsonl`` with its file
and line, and counted against
``data.max_rejected_fraction`` like any other bad row. A UTF-8 byte order mark opening a file is
dropped. A JSON column that holds text in most rows is a text column: a number there makes its row
``wrong_type`` (see :class:`~rayft.data.formats.ResolvedFormat`).
"""

from __future__ import annotations

import bisect
import io
import json
import logging
import os
import shutil
import tempfile
import weakref
from array import array
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from rayft.config.data import DEFAULT_MAX_ROW_BYTES, DataConfig, DatasetConfig
from rayft.data.formats import UNREADABLE_COLUMN, ResolvedFormat, resolve_format
from rayft.data.read.records import csv_records, json_array_items, json_object_items
from rayft.data.read.sources import (
    BOM,
    dataset_files,
    is_json_uri,
    json_rows_key,
    source_file_rows,
    source_name,
    table_batches,
    uri_error,
    uri_files,
)
from rayft.errors import DataError
from rayft.lines import LineReadable, OversizedLine, bounded_lines, describe_size
from rayft.security import mask_uri

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("rayft.data")

BATCH_ROWS = 4096  # rows of a Parquet or in-memory table converted at a time
CSV_BLOCK_BYTES = 1 << 20  # the records of a CSV file parsed at a time
ROW_COLUMN = "row"  # the JSON text column of a spilled rows file
_ROW_BOUND = "the dataset's max_row_bytes"  # the setting that bounds a row's bytes, named in a rejection


class RowStore:
    """A dataset's rows as JSON text, spilled to an Arrow IPC file one batch of rows at a time, so that
    the reading process holds one batch, not the dataset. Preparation's tasks map the file and take
    the rows they need (:func:`take_rows`); ``len``, indexing and iteration read it back here.

    The file lives in ``directory`` (a fresh temporary directory when None, removed with the store).
    """

    def __init__(self, directory: Path | None = None) -> None:
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="rayft-rows-"))
            weakref.finalize(self, shutil.rmtree, directory, True)
        directory.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="rows-", suffix=".arrow", dir=directory)
        os.close(handle)  # Arrow opens the file by name
        self.path = Path(name)
        self._pending: list[str] = []
        self._count = 0
        self._writer: Any = None
        self._table: Any = None

    def append(self, text: str) -> None:
        """Add one row's JSON text."""
        self._pending.append(text)
        self._count += 1
        if len(self._pending) >= BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._writer is None:
            self._writer = pa.ipc.new_file(str(self.path), pa.schema([(ROW_COLUMN, pa.string())]))
        if self._pending:
            self._writer.write_batch(pa.record_batch([pa.array(self._pending, pa.string())], names=[ROW_COLUMN]))
            self._pending = []

    def close(self) -> None:
        """Finish the file (rows appended later are refused by Arrow)."""
        if self._table is None:
            self._flush()
            self._writer.close()
            self._table = open_rows(self.path)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        """One row's JSON text, or a list of those of a slice (read from the mapped file, as a list's slice)."""
        self.close()
        column = self._table.column(ROW_COLUMN)
        if isinstance(index, slice):
            picked = list(range(len(self))[index])
            return [str(text) for text in column.take(picked).to_pylist()] if picked else []
        return str(column[index].as_py())

    def __iter__(self) -> Iterator[str]:
        self.close()
        for batch in self._table.to_batches():
            yield from batch.column(0).to_pylist()


def open_rows(path: Path | str) -> Any:
    """The rows file at ``path`` as an Arrow table mapped from disk (read lazily, not copied)."""
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def take_rows(path: str, rows: Any) -> list[str]:
    """The JSON text of row numbers ``rows`` of the rows file at ``path``. The file is mapped for this
    call only: a worker keeps no mapping of a file that its preparation deletes afterwards."""
    return [str(text) for text in open_rows(path).column(ROW_COLUMN).take(rows).to_pylist()]


@dataclass
class RowOrigins:
    """Where each row of a source came from: its file and line, at 8 bytes a row (a line number in a
    compact array; the file from the row ranges of each file)."""

    files: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    lines: array[int] = field(default_factory=lambda: array("q"))

    def start_file(self, name: str) -> None:
        """Rows added from now on come from the file ``name``."""
        self.files.append(name)
        self.starts.append(len(self.lines))

    def at(self, row: int) -> tuple[str, int]:
        """The file and line of row number ``row``."""
        return self.files[bisect.bisect_right(self.starts, row) - 1], self.lines[row]


@dataclass(frozen=True)
class Source:
    """One dataset as read: its config, report label, resolved format, JSON rows and their origins."""

    config: DatasetConfig
    name: str
    format: ResolvedFormat
    rows: RowStore
    origins: RowOrigins


class RowCollector:
    """The rows of one dataset as they are read: their JSON text and origin, the columns seen, and how
    often each column held text or a number (to find the text columns). Stops at ``limit`` rows."""

    def __init__(self, limit: int | None, spill_dir: Path | None = None) -> None:
        self.limit = limit
        self.rows = RowStore(spill_dir)
        self.origins = RowOrigins()
        self.columns: dict[str, None] = {}  # ordered set
        self.kinds: dict[str, list[int]] = {}  # column -> [rows with text, rows with a number]
        self.filled: set[str] = set()  # columns with a value (not null, blank text or an empty list) in some row
        self.unreadable = 0

    def full(self) -> bool:
        """Whether ``limit`` rows have been read."""
        return self.limit is not None and len(self.rows) >= self.limit

    def add(self, line: int, row: dict[str, Any], text: str | None = None) -> None:
        """Keep a row (``text``: its JSON, when the file already holds it as one line)."""
        for key, value in row.items():
            self.columns.setdefault(key, None)
            if key not in self.filled and not _blank(value):
                self.filled.add(key)
            if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
                self.kinds.setdefault(key, [0, 0])[0 if isinstance(value, str) else 1] += 1
        self.rows.append(text if text is not None else json.dumps(row, ensure_ascii=False, default=str))
        self.origins.lines.append(line)

    def add_unreadable(self, line: int, reason: str, detail: str) -> None:
        """Keep a row that could not be read, as its reason alone."""
        self.unreadable += 1
        self.rows.append(json.dumps({UNREADABLE_COLUMN: [reason, detail]}, ensure_ascii=False))
        self.origins.lines.append(line)

    def text_columns(self) -> frozenset[str]:
        """Columns holding text in at least as many rows as numbers (and text in one row at least)."""
        return frozenset(k for k, (text, number) in self.kinds.items() if text and text >= number)

    def empty_columns(self) -> frozenset[str]:
        """Columns without a value in any row (format detection passes over them)."""
        return frozenset(c for c in self.columns if c not in self.filled)


def _blank(value: Any) -> bool:
    """No value: null, blank text, or an empty list or object."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, list | dict) and not value)


def read_sources(data: DataConfig, spill_dir: Path | None = None) -> list[Source]:
    """Read the training then the validation datasets row by row and resolve their formats; the rows
    are spilled to files in ``spill_dir`` (a temporary directory when None, see :class:`RowStore`)."""
    sources = []
    for ds in [*data.datasets, *data.validation_datasets]:
        rows = read_rows(ds, spill_dir)
        rows.rows.close()
        name = source_name(ds)
        _refuse_unreadable(ds, rows)
        fmt = replace(resolve_format(ds, list(rows.columns), rows.empty_columns()), text_columns=rows.text_columns())
        log.info("data: %s: %d rows (%d unreadable), format %s", name, len(rows.rows), rows.unreadable,
                 fmt.describe())  # fmt: skip
        sources.append(Source(ds, name, fmt, rows.rows, rows.origins))
    return sources


def _refuse_unreadable(ds: DatasetConfig, rows: RowCollector) -> None:
    """DataError for a dataset without one readable row: there is no column to find a format in."""
    if not rows.rows:
        raise DataError(f"dataset {ds.path!r} has no rows; check the path, split ({ds.split!r}) and max_rows")
    if rows.columns:
        return
    file, line = rows.origins.at(0)
    reason, detail = json.loads(rows.rows[0])[UNREADABLE_COLUMN]
    raise DataError(
        f"dataset {ds.path!r}: none of its {len(rows.rows)} rows can be read ({file} line {line}: {reason}, "
        f"{detail}); check that it is UTF-8 JSON Lines, one object per line"
    )


def read_rows(ds: DatasetConfig, spill_dir: Path | None = None) -> RowCollector:
    """Every row of a dataset (at most ``max_rows``), read file by file without holding a file whole."""
    rows = RowCollector(ds.max_rows, spill_dir)
    current: str | None = None
    for item in iter_rows(ds):
        if rows.full():
            break
        if item.file != current:
            rows.origins.start_file(item.file)
            current = item.file
        if item.row is None:
            rows.add_unreadable(item.line, item.reason, item.detail)
        else:
            rows.add(item.line, item.row, item.text)
    return rows


@dataclass(frozen=True)
class ReadRow:
    """One row as read: its file and line, and the row, or why it could not be read (``row`` None)."""

    file: str
    line: int
    row: dict[str, Any] | None
    text: str | None = None  # the row's JSON when the file holds it as one line; a bad line's text
    reason: str = ""
    detail: str = ""


def iter_rows(ds: DatasetConfig) -> Iterator[ReadRow]:
    """Every row of a dataset (at most ``max_rows``), lazily: file by file, a line or a batch of rows
    at a time, so that a consumer holds only what it keeps."""
    files = dataset_files(ds)
    if files is None:  # a built-in set, a URI or a Hub dataset: one stream of rows
        streams: Iterable[Iterator[ReadRow]] = [_remote_rows(ds)]
    else:
        base = Path(ds.path).expanduser()
        names = [path.relative_to(base).as_posix() if ds.files is not None else str(path) for path in files]
        streams = (_file_rows(ds, path, name) for path, name in zip(files, names, strict=True))
    count = 0
    for stream in streams:
        for item in stream:
            if ds.max_rows is not None and count >= ds.max_rows:
                return
            count += 1
            yield item


def _remote_rows(ds: DatasetConfig) -> Iterator[ReadRow]:
    """The rows of a built-in set, a URI or a Hub dataset: JSON Lines a line at a time (a bad line is a
    rejected row), everything else a record batch at a time."""
    if not is_json_uri(ds):
        yield from _batch_rows(mask_uri(ds.path), table_batches(ds, BATCH_ROWS), 1, ds.max_row_bytes)
        return
    yield from uri_json_lines(ds)


def _file_rows(ds: DatasetConfig, path: Path, name: str) -> Iterator[ReadRow]:
    import pyarrow as pa

    suffix = path.suffix.lower()
    try:
        if ds.files is not None:
            yield from _source_file_rows(path, name, ds.chunk_chars)
        elif suffix in (".jsonl", ".json"):
            yield from _json_rows(path, name, ds.max_row_bytes)
        elif suffix == ".parquet":
            yield from _parquet_rows(path, name, ds.max_row_bytes)
        elif suffix == ".csv":
            yield from _csv_rows(path, name, ds.max_row_bytes)
        else:
            raise DataError(
                f"dataset {ds.path!r}: file {path} has an unsupported type; use one of .jsonl, .json, .parquet, .csv"
            )
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"dataset {ds.path!r}: cannot read {path} ({exc}); check that it is valid {suffix[1:]}"
        ) from None


def _json_rows(path: Path, name: str, max_row_bytes: int) -> Iterator[ReadRow]:
    if is_json_array(path):  # one JSON array: its items read one at a time, numbered from 1
        with path.open("rb") as file:
            for number, item in enumerate(json_array_items(file, max_row_bytes), start=1):
                yield _array_item(name, number, item, max_row_bytes)
        return
    if json_rows_key(path) is not None:  # one JSON object holding the list of rows: read the same way
        with path.open("rb") as file:
            for number, item in enumerate(json_object_items(file, max_row_bytes), start=1):
                yield _array_item(name, number, item, max_row_bytes)
        return
    yield from iter_json_lines(path, max_row_bytes, name)


def is_json_array(path: Path) -> bool:
    """Whether ``path`` is a ``.json`` file that holds one JSON array (its first character ``[``)."""
    if path.suffix.lower() != ".json":
        return False
    with path.open("rb") as file:
        return file.read(64).removeprefix(BOM).lstrip().startswith(b"[")


def _array_item(name: str, number: int, item: bytes | OversizedLine, max_row_bytes: int) -> ReadRow:
    """A JSON array's item as a row, or why it is none: too large (not parsed), not JSON, not an object."""
    if isinstance(item, OversizedLine):
        return ReadRow(name, number, None, None, "row_too_large", too_large_detail(item.size, max_row_bytes))
    try:
        value = json.loads(item.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return ReadRow(name, number, None, None, "bad_json", f"item {number} is not valid JSON ({exc})")
    if not isinstance(value, dict):
        return ReadRow(
            name, number, None, None, "bad_json", f"item {number} is a {type(value).__name__}, not an object"
        )
    return _sized_row(name, number, value, max_row_bytes)


def _parquet_rows(path: Path, name: str, max_row_bytes: int) -> Iterator[ReadRow]:
    """Rows numbered from 1 within the file (Parquet has no lines)."""
    import pyarrow.parquet as pq

    yield from _batch_rows(name, pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS), 1, max_row_bytes)


def _csv_rows(path: Path, name: str, max_row_bytes: int) -> Iterator[ReadRow]:
    """Rows numbered by their line, the header being line 1 (a quoted value spanning lines counts once).

    The file is cut into records without holding a record of more than ``max_row_bytes`` (see
    :func:`rayft.data.read.records.csv_records`): such a record is rejected by its size without being
    parsed. The others are parsed by pyarrow a block of records at a time, each block with the
    column types of the first.
    """
    with path.open("rb") as file:
        records = csv_records(file, max_row_bytes)
        header = next(records, None)
        if isinstance(header, OversizedLine):
            raise DataError(
                f"{path}: the header line is {describe_size(header.size)}, above max_row_bytes; check that the "
                "file is CSV with a header line, or raise the dataset's max_row_bytes"
            )
        if header is not None:
            yield from _csv_blocks(name, header, records, max_row_bytes)


def _csv_blocks(
    name: str, header: bytes, records: Iterator[bytes | OversizedLine], max_row_bytes: int
) -> Iterator[ReadRow]:
    """The rows of a CSV file's records after its header, parsed a block at a time."""
    block: list[bytes] = []
    numbers: list[int] = []
    types: dict[str, Any] | None = None
    number, size = 1, 0
    for record in records:
        if isinstance(record, bytes) and not record.strip():
            continue  # a blank line: not a row, as pyarrow reads it
        number += 1
        if isinstance(record, OversizedLine):
            types = yield from _parse_csv_block(name, header, block, numbers, types, max_row_bytes)
            block, numbers, size = [], [], 0
            yield ReadRow(name, number, None, None, "row_too_large", too_large_detail(record.size, max_row_bytes))
            continue
        block.append(record if record.endswith(b"\n") else record + b"\n")
        numbers.append(number)
        size += len(record)
        if size >= CSV_BLOCK_BYTES:
            types = yield from _parse_csv_block(name, header, block, numbers, types, max_row_bytes)
            block, numbers, size = [], [], 0
    yield from _parse_csv_block(name, header, block, numbers, types, max_row_bytes)


def _parse_csv_block(  # noqa: PLR0917 - the state of one block
    name: str, header: bytes, block: list[bytes], numbers: list[int], types: dict[str, Any] | None,
    max_row_bytes: int,
) -> Generator[ReadRow, None, dict[str, Any] | None]:  # fmt: skip
    """The rows of one block of records, parsed with ``types`` (the first block's, which it returns)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not block:
        return types
    options = pacsv.ConvertOptions(column_types=types or {})
    table = pacsv.read_csv(io.BytesIO(header + b"".join(block)), convert_options=options)
    rows = table.to_pylist()
    if len(rows) != len(numbers):
        raise pa.ArrowInvalid(f"{len(numbers)} records from line {numbers[0]} parse as {len(rows)} rows")
    for number, row in zip(numbers, rows, strict=True):
        yield _sized_row(name, number, row, max_row_bytes)
    if types is None:
        types = {field.name: field.type for field in table.schema if not pa.types.is_null(field.type)}
    return types


def _batch_rows(name: str, batches: Iterable[pa.RecordBatch], first_line: int, max_row_bytes: int) -> Iterator[ReadRow]:
    """The rows of a stream of record batches, numbered from ``first_line``; a row of more than
    ``max_row_bytes`` is rejected (``row_too_large``): by the bytes of its text and binary cells,
    measured in Arrow, before it is made a Python object; by its JSON once it is one."""
    number = first_line
    for batch in batches:
        sizes = cell_bytes(batch)
        if max(sizes, default=0) <= max_row_bytes:
            for row in batch.to_pylist():
                yield _sized_row(name, number, row, max_row_bytes)
                number += 1
            continue
        for index, size in enumerate(sizes):
            if size > max_row_bytes:
                yield ReadRow(name, number, None, None, "row_too_large", too_large_detail(size, max_row_bytes))
            else:
                yield _sized_row(name, number, batch.slice(index, 1).to_pylist()[0], max_row_bytes)
            number += 1


def cell_bytes(batch: pa.RecordBatch) -> list[int]:
    """The bytes each row of ``batch`` holds in its text and binary columns (nulls count 0)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    total = np.zeros(batch.num_rows, dtype=np.int64)
    for column in batch.columns:
        kind = column.type
        if (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or (pa.types.is_large_binary(kind))
        ):
            total += pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return [int(size) for size in total]


def _sized_row(name: str, number: int, row: dict[str, Any], max_row_bytes: int) -> ReadRow:
    """A row read whole (a batch's, a JSON list's item) with its JSON text, or rejected as too large."""
    text = json.dumps(row, ensure_ascii=False, default=str)
    size = len(text.encode("utf-8"))
    if size > max_row_bytes:
        return ReadRow(name, number, None, None, "row_too_large", too_large_detail(size, max_row_bytes))
    return ReadRow(name, number, row, text)


def _source_file_rows(path: Path, name: str, chunk_chars: int | None) -> Iterator[ReadRow]:
    """A source file's text rows, each numbered by the line it starts on."""
    line = 1
    for row in source_file_rows(path.read_bytes(), name, chunk_chars):
        yield ReadRow(name, line, row)
        line += (row["text"] or "").count("\n")


def uri_json_lines(ds: DatasetConfig) -> Iterator[ReadRow]:
    """Each non-blank line of a JSON Lines URI's files, read a line at a time; a bad line comes back
    without a row (see :func:`iter_json_lines`), so one bad line never refuses the file."""
    import io

    filesystem, files = uri_files(ds)
    base = mask_uri(ds.path.split("?", 1)[0])  # the name lands in reports: never with its credentials
    for path in files:
        name = base if len(files) == 1 else f"{base.rstrip('/')}/{Path(path).name}"
        try:
            with filesystem.open_input_stream(path) as stream:
                yield from json_lines_of(io.BufferedReader(stream), ds.max_row_bytes, name)
        except OSError as exc:
            raise uri_error(ds, exc) from None


def iter_json_lines(
    path: Path, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, name: str | None = None, *, setting: str = _ROW_BOUND
) -> Iterator[ReadRow]:
    """The non-blank lines of a JSON Lines file as rows of the file ``name`` (default: ``path``), read one
    line at a time (never the whole file): the one reader of JSON Lines (datasets, ``rayft generate``'s prompts).

    A UTF-8 byte order mark opening the file is dropped. A line that is not UTF-8 (``bad_encoding``,
    naming the first bad byte), not JSON, or not a JSON object (``bad_json``), or that repeats a key
    (``duplicate_key``) comes back without a row (with its text, for the report), as does a line of more
    than ``max_row_bytes`` bytes (``row_too_large``, naming ``setting``, the bound's setting), which is
    skipped without being held whole.
    """
    with path.open("rb") as file:
        yield from json_lines_of(file, max_row_bytes, str(path) if name is None else name, setting=setting)


def json_lines_of(file: LineReadable, max_row_bytes: int, name: str, *, setting: str = _ROW_BOUND) -> Iterator[ReadRow]:
    """The non-blank lines of an open JSON Lines stream (see :func:`iter_json_lines`)."""
    for number, raw in enumerate(bounded_lines(file, max_row_bytes), start=1):
        if isinstance(raw, OversizedLine):
            detail = too_large_detail(raw.size, max_row_bytes, setting)
            yield ReadRow(name, number, None, None, "row_too_large", detail)
            continue
        line = raw.removeprefix(BOM) if number == 1 else raw
        if line.strip():
            yield _parse_line(name, number, line)


def too_large_detail(size: int, max_row_bytes: int, setting: str = _ROW_BOUND) -> str:
    """Why a row was rejected as too large: its size against the bound (``setting``), and the fix."""
    short = setting.removeprefix("the dataset's ")
    return f"{describe_size(size)}, above {short} ({describe_size(max_row_bytes)}); split the row or raise {setting}"


def _parse_line(name: str, number: int, raw: bytes) -> ReadRow:
    """One line's row, or why it has none (with the line's text, undecodable bytes replaced)."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        detail = f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} of the line ({exc.reason})"
        return ReadRow(name, number, None, raw.decode("utf-8", "replace").strip(), "bad_encoding", detail)
    try:
        row = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        return ReadRow(name, number, None, text, "bad_json", f"not JSON: {exc.msg} at column {exc.colno}")
    except DuplicateKeyError as exc:
        detail = f"key {exc.key!r} appears twice in one object; keep one"
        return ReadRow(name, number, None, text, "duplicate_key", detail)
    if not isinstance(row, dict):
        return ReadRow(name, number, None, text, "bad_json", f"a {type(row).__name__}, not an object")
    return ReadRow(name, number, row, text)


class DuplicateKeyError(ValueError):
    """A JSON object that repeats a key (``json`` keeps the last silently; rayft refuses the row)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict, or DuplicateKeyError naming a repeated key."""
    found = dict(pairs)
    if len(found) != len(pairs):  # rare: only then look for the repeated key
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return found
