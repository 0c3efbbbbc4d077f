"""Reading a dataset's rows as one Arrow table, whatever it is: a local file or directory, a URI, a
Hugging Face Hub dataset, or a built-in set.

Errors name the dataset, the file (and line, for JSON Lines), the problem and the fix. Rows are
returned as they are: checking and rendering them is the preparation step's job.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.data import DataConfig, DatasetConfig
from rayft.data.builtin import is_builtin, load_builtin
from rayft.data.formats import ENCODING_ERROR_COLUMN, ResolvedFormat, resolve_format
from rayft.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("rayft.data")

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
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


def _looks_local(path: str) -> bool:
    p = Path(path).expanduser()
    return p.exists() or p.is_absolute() or path.startswith(".") or p.suffix.lower() in SUFFIXES


def _read_local(ds: DatasetConfig, path: Path) -> pa.Table:
    import pyarrow as pa

    if not path.exists():
        raise DataError(f"dataset path {ds.path!r}: no such file or directory ({path.resolve()}); fix data path")
    files = _data_files(ds, path) if path.is_dir() else [path]
    tables = [_read_file(ds, f) for f in files]
    try:
        return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"dataset {ds.path!r}: its files do not share one schema ({exc}); make the columns agree"
        ) from None


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
            return _rows_to_table(ds, path, _read_json_rows(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"dataset {ds.path!r}: cannot read {path} ({exc}); check that it is valid {suffix[1:]}"
        ) from None
    raise DataError(f"dataset {ds.path!r}: file {path} has an unsupported type; use one of {', '.join(SUFFIXES)}")


def _read_json_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # perhaps JSON Lines under a .json name
        if isinstance(data, list):
            return _only_objects(path, data)
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) == 1:
                return _only_objects(path, lists[0])
            raise DataError(f"{path}: a JSON object must hold exactly one list of rows (found {len(lists)})")
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(f"line {number}: {exc.msg}")
            continue
        if not isinstance(row, dict):
            bad.append(f"line {number}: a {type(row).__name__}, not an object")
            continue
        rows.append(row)
    if bad:
        listed = "; ".join(bad[:_MAX_LISTED]) + (
            f"; and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        )
        raise DataError(f"{path}: {len(bad)} line(s) are not JSON objects ({listed}); fix or remove them")
    return rows


def _only_objects(path: Path, data: list[Any]) -> list[dict[str, Any]]:
    bad = [i for i, row in enumerate(data) if not isinstance(row, dict)]
    if bad:
        raise DataError(f"{path}: rows {bad[:_MAX_LISTED]} are not JSON objects; every row must be an object")
    return data


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
    rows = [row for f in matched for row in source_file_rows(f.read_bytes(), f.relative_to(directory).as_posix(),
                                                             ds.chunk_chars)]  # fmt: skip
    bad = sum(1 for row in rows if row[ENCODING_ERROR_COLUMN])
    log.info("data: %s: %d files as %d rows (%d not UTF-8)", source_name(ds), len(matched), len(rows), bad)
    return pa.Table.from_pylist(rows, schema=_SOURCE_SCHEMA())


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
    import pyarrow.dataset as pads

    suffix = Path(ds.path.split("?", 1)[0]).suffix.lower()
    fmt = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}.get(suffix, "parquet")
    try:
        return pads.dataset(ds.path, format=fmt).to_table()
    except Exception as exc:  # pyarrow raises many kinds for remote stores
        raise DataError(
            f"dataset {ds.path!r}: cannot read it with pyarrow ({type(exc).__name__}: {exc}); check the URI, "
            "its credentials (environment), and that the file type is one of parquet/csv/jsonl"
        ) from None


def _read_hub(ds: DatasetConfig) -> pa.Table:
    import datasets

    try:
        loaded = datasets.load_dataset(
            ds.path, ds.config_name, data_dir=ds.data_dir, split=ds.split, revision=ds.revision
        )
    except Exception as exc:  # the Hub client raises many kinds (offline, not found, bad config)
        raise DataError(
            f"dataset {ds.path!r} (config {ds.config_name!r}, split {ds.split!r}) cannot be loaded from the Hugging "
            f"Face Hub ({type(exc).__name__}: {str(exc)[:300]}). If this machine is offline, download it where the "
            "Hub is reachable and set path to the local file or directory; if it is a local path, check it exists"
        ) from None
    table: pa.Table = loaded.with_format("arrow")[:]
    return table


@dataclass(frozen=True)
class Source:
    """One dataset as read: its config, report label, resolved format and JSON rows."""

    config: DatasetConfig
    name: str
    format: ResolvedFormat
    rows: list[str]


def read_sources(data: DataConfig) -> list[Source]:
    """Read the training then the validation datasets, resolve their formats, and serialise rows as JSON."""
    sources = []
    for ds in [*data.datasets, *data.validation_datasets]:
        table = read_table(ds)
        fmt = resolve_format(ds, table.column_names)
        name = source_name(ds)
        log.info("data: %s: %d rows, format %s", name, table.num_rows, fmt.describe())
        sources.append(Source(ds, name, fmt, _json_rows(table)))
    return sources


def _json_rows(table: pa.Table) -> list[str]:
    return [json.dumps(row, sort_keys=True, ensure_ascii=False, default=str) for row in table.to_pylist()]
