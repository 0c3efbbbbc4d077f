"""Where a dataset's rows are, whatever the dataset is: which local files (a file, a directory of one
type, or the files a glob matches), a URI's files and their record batches, a Hugging Face Hub
dataset's or a built-in set's record batches, a JSON document's items, a source file as text rows.

:mod:`rayft.data.read.rows` reads them, row by row: it is the one reader of datasets, and this module
is what it reads from. Errors name the dataset, the file, the problem and the fix. Rows are returned
as they are: checking and rendering them is the preparation step's job.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.data import DatasetConfig
from rayft.data.builtin import is_builtin, load_builtin
from rayft.data.formats import ENCODING_ERROR_COLUMN
from rayft.data.read.records import json_object_lists
from rayft.errors import DataError
from rayft.security import mask_uri

if TYPE_CHECKING:
    import pyarrow as pa


SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
BOM = b"\xef\xbb\xbf"


def source_name(ds: DatasetConfig) -> str:
    """A short label for a dataset in reports: its ``name``, else its path's last component."""
    if ds.name:
        return ds.name
    return ds.path.rstrip("/").rsplit("/", 1)[-1] or ds.path


def _refuse_stage(ds: DatasetConfig) -> None:
    if ds.path.startswith("stage:"):
        raise DataError(
            f"dataset path {ds.path!r} names the output of a pipeline stage; run the config with `rayft run`, "
            "or set the path to that stage's output file (for example runs/<name>/sdg/data.jsonl)"
        )


def table_batches(ds: DatasetConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of a dataset that is not local files (a built-in set, a URI, a Hub dataset) as record
    batches of at most ``batch_rows``, read lazily: a URI's files are scanned a batch at a time and a Hub
    dataset is read from its memory-mapped cache, so a consumer holds only the batch it is on."""
    import pyarrow as pa

    _refuse_stage(ds)
    if is_builtin(ds.path):  # small, and generated whole
        yield from pa.Table.from_pylist(load_builtin(ds.path, ds.split, ds.max_rows)).to_batches(batch_rows)
    elif "://" in ds.path:
        yield from _uri_batches(ds, batch_rows)
    else:
        for table in _load_hub(ds).with_format("arrow").iter(batch_size=batch_rows):
            yield from table.to_batches()


def _uri_batches(ds: DatasetConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """A URI's record batches, file by file through the store's own streaming readers; a store's failure
    is a DataError whenever it comes."""
    filesystem, files = uri_files(ds)
    for path in files:
        batches = iter(_file_batches(filesystem, path, batch_rows))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as exc:  # pyarrow raises many kinds for remote stores
                raise uri_error(ds, exc) from None
            yield batch


def uri_files(ds: DatasetConfig) -> tuple[Any, list[str]]:
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
        raise uri_error(ds, exc) from None
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


def json_rows_key(path: Path) -> str | None:
    """The key of the list of rows in a ``.json`` file that holds one JSON object (``{"data": [...]}``);
    None for any other file (a JSON array, JSON Lines whatever the suffix). The object is scanned in
    pieces, holding none of its values: only its structure is read here."""
    if path.suffix.lower() != ".json":
        return None
    with path.open("rb") as file:
        if not file.read(64).removeprefix(BOM).lstrip().startswith(b"{"):
            return None
        file.seek(0)
        keys = json_object_lists(file)
    if keys is None:
        return None  # more than one object: JSON Lines under a .json name
    if len(keys) != 1:
        found = f"found {len(keys)}" + (f": {', '.join(repr(k) for k in keys[:5])}" if keys else "")
        raise DataError(
            f"{path}: a JSON object must hold exactly one list of rows ({found}); keep the rows in one list, "
            "or write them as JSON Lines"
        )
    return keys[0]


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


def uri_error(ds: DatasetConfig, exc: Exception) -> DataError:
    return DataError(
        mask_uri(
            f"dataset {ds.path!r}: cannot read it with pyarrow ({type(exc).__name__}: {exc}); check the URI, "
            "its credentials (environment), and that the file type is one of parquet/csv/jsonl"
        )
    )


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
