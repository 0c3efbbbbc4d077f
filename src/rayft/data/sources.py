"""Reading a dataset's rows as one Arrow table, whatever it is: a local file or directory, a URI, a
Hugging Face Hub dataset, or a built-in set (for evaluation and seeds), and the pieces that
preparation's row-by-row reader (:mod:`rayft.data.reader`) shares with it: which files a dataset
is, and JSON Lines read one line at a time.

Errors name the dataset, the file (and line, for JSON Lines), the problem and the fix. Rows are
returned as they are: checking and rendering them is the preparation step's job.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.data import DEFAULT_MAX_ROW_BYTES, DatasetConfig
from rayft.data.builtin import is_builtin, load_builtin
from rayft.data.formats import ENCODING_ERROR_COLUMN
from rayft.errors import DataError
from rayft.lines import LineReadable, OversizedLine, bounded_lines, describe_size
from rayft.security import mask_uri

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

log = logging.getLogger("rayft.data")

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
BOM = b"\xef\xbb\xbf"
_MAX_LISTED = 5


def source_name(ds: DatasetConfig) -> str:
    """A short label for a dataset in reports: its ``name``, else its path's last component."""
    if ds.name:
        return ds.name
    return ds.path.rstrip("/").rsplit("/", 1)[-1] or ds.path


def read_table(ds: DatasetConfig) -> pa.Table:
    """All rows of a dataset (at most ``max_rows``) as an Arrow table."""
    import pyarrow as pa

    if ds.path.startswith("stage:"):
        raise DataError(
            f"dataset path {ds.path!r} names the output of a pipeline stage; run the config with `rayft run`, "
            "or set the path to that stage's output file (for example runs/<name>/sdg/data.jsonl)"
        )
    if is_builtin(ds.path):
        table = pa.Table.from_pylist(load_builtin(ds.path, ds.split, ds.max_rows))
    elif "://" in ds.path:
        table = _read_uri(ds)
    elif ds.files is not None:
        table = _read_source_files(ds, Path(ds.path).expanduser())
    elif _looks_local(ds.path):
        table = _read_local(ds, Path(ds.path).expanduser())
    else:
        table = _read_hub(ds)
    if ds.max_rows is not None and table.num_rows > ds.max_rows:
        table = table.slice(0, ds.max_rows)
    if table.num_rows == 0:
        raise DataError(f"dataset {ds.path!r} has no rows; check the path, split ({ds.split!r}) and max_rows")
    return table


def table_batches(ds: DatasetConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of a dataset that is not local files (a built-in set, a URI, a Hub dataset) as record
    batches of at most ``batch_rows``, read lazily: a URI's files are scanned a batch at a time and a Hub
    dataset is read from its memory-mapped cache, so a consumer holds only the batch it is on."""
    if ds.path.startswith("stage:") or is_builtin(ds.path):
        yield from read_table(ds).to_batches(batch_rows)  # read_table explains a stage path; built-ins are small
    elif "://" in ds.path:
        yield from _uri_batches(ds, batch_rows)
    else:
        for table in _load_hub(ds).with_format("arrow").iter(batch_size=batch_rows):
            yield from table.to_batches()


def _uri_batches(ds: DatasetConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """A URI's record batches, file by file through the store's own streaming readers; a store's failure
    is a DataError whenever it comes."""
    filesystem, files = _uri_files(ds)
    for path in files:
        batches = iter(_file_batches(filesystem, path, batch_rows))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as exc:  # pyarrow raises many kinds for remote stores
                raise _uri_error(ds, exc) from None
            yield batch


def uri_json_lines(ds: DatasetConfig) -> Iterator[tuple[str, JsonLine]]:
    """Each non-blank line of a JSON Lines URI's files, with the file's URI, read a line at a time; a bad
    line comes back without a row (see :func:`iter_json_lines`), so one bad line never refuses the file."""
    import io

    filesystem, files = _uri_files(ds)
    base = mask_uri(ds.path.split("?", 1)[0])  # the name lands in reports: never with its credentials
    for path in files:
        name = base if len(files) == 1 else f"{base.rstrip('/')}/{Path(path).name}"
        try:
            with filesystem.open_input_stream(path) as stream:
                for line in json_lines_of(io.BufferedReader(stream), ds.max_row_bytes):
                    yield name, line
        except OSError as exc:
            raise _uri_error(ds, exc) from None


def _uri_files(ds: DatasetConfig) -> tuple[Any, list[str]]:
    """The filesystem of a URI and its files in name order: the file itself, or every file under a directory
    (hidden and underscore-prefixed names skipped, as Arrow datasets do)."""
    import pyarrow.fs as pafs

    try:
        filesystem, root = pafs.FileSystem.from_uri(ds.path)
        info = filesystem.get_file_info(root)
        if info.type == pafs.FileType.File:
            return filesystem, [root]
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"no such file or directory: {root}")
        found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    except Exception as exc:  # pyarrow raises many kinds for remote stores
        raise _uri_error(ds, exc) from None
    names = [i.path for i in found if i.type == pafs.FileType.File and not Path(i.path).name.startswith((".", "_"))]
    return filesystem, sorted(names)


def is_json_uri(ds: DatasetConfig) -> bool:
    """Whether ``ds`` is a URI of JSON Lines (read line by line, so that a bad line is a rejected row)."""
    return "://" in ds.path and Path(ds.path.split("?", 1)[0]).suffix.lower() in (".jsonl", ".json")


def _file_batches(filesystem: Any, path: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """One file's batches, read as they are consumed. Not ``Dataset.to_batches``: its scanner reads every
    row group of a file ahead of the consumer, which holds the whole file in memory."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        with filesystem.open_input_stream(path) as stream:
            yield from pajson.open_json(stream)
    elif suffix == ".csv":
        with filesystem.open_input_stream(path) as stream:
            yield from pacsv.open_csv(stream)
    else:
        with filesystem.open_input_file(path) as file:
            yield from pq.ParquetFile(file).iter_batches(batch_size=batch_rows)


def _looks_local(path: str) -> bool:
    p = Path(path).expanduser()
    return p.exists() or p.is_absolute() or path.startswith(".") or p.suffix.lower() in SUFFIXES


def _read_local(ds: DatasetConfig, path: Path) -> pa.Table:
    import pyarrow as pa

    tables = [_read_file(ds, f) for f in _local_files(ds, path)]
    try:
        return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"dataset {ds.path!r}: its files do not share one schema ({exc}); make the columns agree"
        ) from None


def dataset_files(ds: DatasetConfig) -> list[Path] | None:
    """The local files a dataset is read from, in reading order (DataError when there are none); None
    for a dataset that is not local files (a built-in set, a URI, a Hub dataset)."""
    if ds.path.startswith("stage:") or is_builtin(ds.path) or "://" in ds.path:
        return None
    if ds.files is not None:
        return matched_source_files(ds, Path(ds.path).expanduser())
    return _local_files(ds, Path(ds.path).expanduser()) if _looks_local(ds.path) else None


def _local_files(ds: DatasetConfig, path: Path) -> list[Path]:
    if not path.exists():
        raise DataError(f"dataset path {ds.path!r}: {why_missing(path)}; fix data path")
    return _data_files(ds, path) if path.is_dir() else [path]


def why_missing(path: Path) -> str:
    """Why ``path`` cannot be read, for an error message: a symbolic link loop, a link to nothing, or no
    such file. Never resolves the path (resolving a loop raises)."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symbolic link loop ({os.path.abspath(path)} leads back to itself)"
        if path.is_symlink():
            return f"a symbolic link to nothing ({os.path.abspath(path)} -> {os.readlink(path)})"
    return f"no such file or directory ({os.path.abspath(path)})"


def _data_files(ds: DatasetConfig, directory: Path) -> list[Path]:
    by_suffix: dict[str, list[Path]] = {}
    for f in sorted(directory.rglob("*")):
        if f.is_file() and f.suffix.lower() in SUFFIXES and not f.name.startswith((".", "_")):
            by_suffix.setdefault(f.suffix.lower(), []).append(f)
    if not by_suffix:
        raise DataError(f"dataset directory {ds.path!r} holds no {'/'.join(SUFFIXES)} files; point path at a data file")
    if len(by_suffix) > 1:
        kinds = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_suffix.items()))
        raise DataError(
            f"dataset directory {ds.path!r} mixes file types ({kinds}); point path at one file or a one-type directory"
        )
    return next(iter(by_suffix.values()))


def _read_file(ds: DatasetConfig, path: Path) -> pa.Table:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix == ".csv":
            return pacsv.read_csv(path)
        if suffix in (".jsonl", ".json"):
            return _rows_to_table(ds, path, _read_json_rows(path, ds.max_row_bytes))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"dataset {ds.path!r}: cannot read {path} ({exc}); check that it is valid {suffix[1:]}"
        ) from None
    raise DataError(f"dataset {ds.path!r}: file {path} has an unsupported type; use one of {', '.join(SUFFIXES)}")


def _read_json_rows(path: Path, max_row_bytes: int) -> list[dict[str, Any]]:
    """Every row of a JSON or JSON Lines file, or DataError listing the lines that are not JSON objects
    or are larger than ``max_row_bytes`` (a table has no place for a bad row; preparation reports them
    per row: :mod:`rayft.data.reader`)."""
    document = json_document(path)
    if document is not None:
        return _only_objects(path, document, max_row_bytes)
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in iter_json_lines(path, max_row_bytes):
        if line.row is None:
            bad.append(f"line {line.number}: {line.detail}")
        else:
            rows.append(line.row)
    if bad:
        listed = "; ".join(bad[:_MAX_LISTED]) + (
            f"; and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        )
        raise DataError(f"{path}: {len(bad)} line(s) are not JSON objects or are too large ({listed}); fix or "
                        "remove them")  # fmt: skip
    return rows


def json_document(path: Path) -> list[Any] | None:
    """The rows of a ``.json`` file that holds one JSON document (a list of rows, or an object with one
    such list); None for JSON Lines, whatever the suffix. A document is read whole: only JSON Lines stream."""
    if path.suffix.lower() != ".json":
        return None
    with path.open("rb") as file:
        head = file.read(64).lstrip(BOM).lstrip()
    if not head.startswith((b"[", b"{")):
        return None
    try:
        data = json.loads(path.read_bytes().removeprefix(BOM).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # perhaps JSON Lines under a .json name
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
        raise DataError(f"{path}: a JSON object must hold exactly one list of rows (found {len(lists)})")
    return None


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSON Lines file: its 1-based number, and the row it holds, or why not."""

    number: int
    text: str
    row: dict[str, Any] | None
    reason: str = ""
    detail: str = ""


def iter_json_lines(path: Path, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[JsonLine]:
    """The non-blank lines of a JSON Lines file, read one line at a time (never the whole file).

    A UTF-8 byte order mark opening the file is dropped. A line that is not UTF-8 (``bad_encoding``,
    naming the first bad byte), not JSON, or not a JSON object (``bad_json``) comes back without a row,
    as does a line of more than ``max_row_bytes`` bytes (``row_too_large``), which is skipped without
    being held whole.
    """
    with path.open("rb") as file:
        yield from json_lines_of(file, max_row_bytes)


def json_lines_of(file: LineReadable, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[JsonLine]:
    """The non-blank lines of an open JSON Lines stream (see :func:`iter_json_lines`)."""
    for number, raw in enumerate(bounded_lines(file, max_row_bytes), start=1):
        if isinstance(raw, OversizedLine):
            yield JsonLine(number, "", None, "row_too_large", too_large_detail(raw.size, max_row_bytes))
            continue
        line = raw.removeprefix(BOM) if number == 1 else raw
        if line.strip():
            yield _parse_line(number, line)


def too_large_detail(size: int, max_row_bytes: int) -> str:
    """Why a row was rejected as too large: its size against the bound, and the fix."""
    return (
        f"{describe_size(size)}, above max_row_bytes ({describe_size(max_row_bytes)}); "
        "split the row or raise the dataset's max_row_bytes"
    )


def _parse_line(number: int, raw: bytes) -> JsonLine:
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        detail = f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} of the line ({exc.reason})"
        return JsonLine(number, "", None, "bad_encoding", detail)
    try:
        row = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        return JsonLine(number, text, None, "bad_json", f"not JSON: {exc.msg} at column {exc.colno}")
    except DuplicateKeyError as exc:
        return JsonLine(number, text, None, "duplicate_key", f"key {exc.key!r} appears twice in one object; keep one")
    if not isinstance(row, dict):
        return JsonLine(number, text, None, "bad_json", f"a {type(row).__name__}, not an object")
    return JsonLine(number, text, row)


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


def _only_objects(path: Path, data: list[Any], max_row_bytes: int) -> list[dict[str, Any]]:
    bad = [i for i, row in enumerate(data) if not isinstance(row, dict)]
    if bad:
        raise DataError(f"{path}: rows {bad[:_MAX_LISTED]} are not JSON objects; every row must be an object")
    large = [(i, size) for i, row in enumerate(data) if (size := row_size(row)) > max_row_bytes]
    if large:
        first, size = large[0]
        raise DataError(f"{path}: {len(large)} item(s) larger than max_row_bytes (item {first + 1}: "
                        f"{too_large_detail(size, max_row_bytes)})")  # fmt: skip
    return data


def row_size(row: Any) -> int:
    """A row's size in bytes as JSON text (UTF-8): what max_row_bytes bounds for rows not read as lines."""
    return len(json.dumps(row, ensure_ascii=False, default=str).encode("utf-8"))


def _rows_to_table(ds: DatasetConfig, path: Path, rows: list[dict[str, Any]]) -> pa.Table:
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        column = _inconsistent_column(rows)
        where = f"column {column!r}" if column else "some column"
        raise DataError(
            f"dataset {ds.path!r}: {path}: {where} holds values of different types ({exc}); "
            "give every row the same type in that column"
        ) from None


def _inconsistent_column(rows: list[dict[str, Any]]) -> str | None:
    kinds: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.items():
            if value is not None:
                kinds.setdefault(key, set()).add(type(value).__name__)
    return next((k for k, v in kinds.items() if len(v) > 1), None)


def _read_source_files(ds: DatasetConfig, directory: Path) -> pa.Table:
    """Every file under ``directory`` matching ``ds.files`` (sorted; none under a hidden directory)
    as text rows (see :func:`source_file_rows`)."""
    import pyarrow as pa

    matched = matched_source_files(ds, directory)
    rows = [row for f in matched for row in source_file_rows(f.read_bytes(), f.relative_to(directory).as_posix(),
                                                             ds.chunk_chars)]  # fmt: skip
    bad = sum(1 for row in rows if row[ENCODING_ERROR_COLUMN])
    log.info("data: %s: %d files as %d rows (%d not UTF-8)", source_name(ds), len(matched), len(rows), bad)
    return pa.Table.from_pylist(rows, schema=_SOURCE_SCHEMA())


def matched_source_files(ds: DatasetConfig, directory: Path) -> list[Path]:
    """The files under ``directory`` that ``ds.files`` matches, sorted, none under a hidden directory."""
    if not directory.is_dir():
        raise DataError(
            f"dataset {ds.path!r}: files={ds.files!r} needs path to be a local directory ({directory.resolve()} is "
            "not one); point path at the directory that holds the source files"
        )
    matched = [f for f in sorted(directory.glob(ds.files or "")) if f.is_file() and not any(
        part.startswith(".") for part in f.relative_to(directory).parts)]  # fmt: skip
    if not matched:
        raise DataError(f"dataset {ds.path!r}: no file matches files={ds.files!r} under {directory.resolve()}; "
                        "fix the glob (e.g. '**/*.py' for every .py file at any depth)")  # fmt: skip
    return matched


def _SOURCE_SCHEMA() -> pa.Schema:  # noqa: N802 - a constant built late (pyarrow is imported when used)
    import pyarrow as pa

    return pa.schema([("text", pa.string()), ("path", pa.string()), ("chunk", pa.int32()),
                      (ENCODING_ERROR_COLUMN, pa.string())])  # fmt: skip


def source_file_rows(data: bytes, path: str, chunk_chars: int | None) -> list[dict[str, Any]]:
    """The rows of one source file: its text (in pieces of at most ``chunk_chars`` characters, cut
    at line ends), or one row without text naming the first byte that is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        error = f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} ({exc.reason})"
        return [{"text": None, "path": path, "chunk": 0, ENCODING_ERROR_COLUMN: error}]
    pieces = chunk_text(text, chunk_chars) if chunk_chars else [text]
    return [{"text": piece, "path": path, "chunk": i, ENCODING_ERROR_COLUMN: None} for i, piece in enumerate(pieces)]


def chunk_text(text: str, limit: int) -> list[str]:
    """``text`` cut into pieces of at most ``limit`` characters, at line ends where a line fits; the
    pieces joined give ``text`` back."""
    lines = [
        part[start : start + limit]  # a line longer than a piece is cut where it passes the limit
        for part in text.splitlines(keepends=True)
        for start in range(0, len(part), limit)
    ]
    pieces: list[str] = []
    current = ""
    for line in lines:
        if current and len(current) + len(line) > limit:
            pieces.append(current)
            current = ""
        current += line
    if current:
        pieces.append(current)
    return pieces


def _read_uri(ds: DatasetConfig) -> pa.Table:
    try:
        return _uri_dataset(ds).to_table()
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises many kinds for remote stores
        raise _uri_error(ds, exc) from None


def _uri_dataset(ds: DatasetConfig) -> pads.Dataset:
    import pyarrow.dataset as pads

    suffix = Path(ds.path.split("?", 1)[0]).suffix.lower()
    fmt = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}.get(suffix, "parquet")
    try:
        return pads.dataset(ds.path, format=fmt)
    except Exception as exc:  # pyarrow raises many kinds for remote stores
        raise _uri_error(ds, exc) from None


def _uri_error(ds: DatasetConfig, exc: Exception) -> DataError:
    return DataError(
        mask_uri(
            f"dataset {ds.path!r}: cannot read it with pyarrow ({type(exc).__name__}: {exc}); check the URI, "
            "its credentials (environment), and that the file type is one of parquet/csv/jsonl"
        )
    )


def _read_hub(ds: DatasetConfig) -> pa.Table:
    table: pa.Table = _load_hub(ds).with_format("arrow")[:]
    return table


def _load_hub(ds: DatasetConfig) -> Any:
    """A Hub dataset's split, loaded into (or from) the local datasets cache, memory-mapped."""
    import datasets

    try:
        return datasets.load_dataset(
            ds.path, ds.config_name, data_dir=ds.data_dir, split=ds.split, revision=ds.revision
        )
    except Exception as exc:  # the Hub client raises many kinds (offline, not found, bad config)
        raise DataError(
            f"dataset {ds.path!r} (config {ds.config_name!r}, split {ds.split!r}) cannot be loaded from the Hugging "
            f"Face Hub ({type(exc).__name__}: {str(exc)[:300]}). If this machine is offline, download it where the "
            "Hub is reachable and set path to the local file or directory; if it is a local path, check it exists"
        ) from None
