"""Writing files and directories so that no reader sees half of one: the one place rayft does it.

A file is written under a temporary name beside it, then renamed over it; a directory is written
whole under a staging name beside it, then renamed into place. Temporary and staging names are
hidden and carry the process id, so that two processes writing the same thing never share one.
Text written whole (:func:`write_text_atomic`) or row by row (:class:`AtomicJsonl`) has its credentials
masked (:mod:`rayft.security`). And the other side: why a file a user names cannot be read
(:func:`unreadable_file`), said as it is.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from rayft.errors import StorageError
from rayft.security import redact


def temp_path(path: Path, purpose: str = "tmp") -> Path:
    """The hidden name beside ``path`` that a write of it goes through (``.NAME.PURPOSE-PID``)."""
    return path.with_name(f".{path.name}.{purpose}-{os.getpid()}")


@contextlib.contextmanager
def replacing(path: Path, *, sync: bool = False) -> Iterator[IO[str]]:
    """A text file open for writing that replaces ``path`` when the block ends without an error:
    readers see the old file or the whole new one. With ``sync`` it reaches the disk before the
    rename (for files a crash must not leave empty). On an error the temporary file is removed and
    the ``OSError`` or the block's exception propagates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path(path)
    try:
        with temp.open("w", encoding="utf-8") as handle:
            yield handle
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """:func:`replacing` for writers that take a path (Parquet, JSON Lines of a library): ``write``
    writes the temporary file, which is then renamed over ``path``; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path(path)
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: Path, text: str, *, where: str = "", fix: str = "choose a writable directory") -> Path:
    """Write ``text``, its credentials masked (:func:`rayft.security.redact`), to ``path`` through
    :func:`replacing`; return ``path``.

    ``where`` names the setting that chose the place (for example ``storage_path``) and ``fix`` what
    to do, both in the :class:`~rayft.errors.StorageError` raised when the write fails.
    """
    try:
        with replacing(path) as handle:
            handle.write(redact(text))
    except OSError as exc:
        prefix = f"{where}: " if where else ""
        raise StorageError(f"{prefix}cannot write {path} ({exc.strerror}); {fix}") from exc
    return path


def staging_dir(target: Path, purpose: str = "partial") -> Path:
    """An empty staging directory beside ``target`` (same filesystem, so the final rename is atomic),
    removed first if a crashed write of this process id left one."""
    staging = temp_path(target, purpose)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def replace_dir(staging: Path, target: Path, *, sync: bool = False) -> Path:
    """Put the fully written directory ``staging`` (beside ``target``) in place of ``target``; return
    ``target``. An existing ``target`` is renamed aside first and deleted after, so it is missing
    only between two renames. With ``sync`` the directory entries reach the disk (checkpoints)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if target.exists():
        old = temp_path(target, "old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    if sync:
        fsync_dir(staging)
    os.replace(staging, target)
    if sync:
        fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def publish_dir_once(staging: Path, target: Path) -> bool:
    """Put the fully written directory ``staging`` in place as ``target`` unless ``target`` exists,
    for content that is the same whoever writes it (two processes writing it at once: the first
    rename wins, the other's staging is deleted). Whether this call put it there."""
    try:
        os.rename(staging, target)  # refuses an existing non-empty target, so readers never see it swapped
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():
            raise
        return False
    return True


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unreadable_file(path: Path) -> str | None:
    """Why ``path`` cannot be opened as a file, as the end of a sentence naming it ("does not exist", "is a
    directory, not a file", a link to nothing or a loop, ...); None when it can be. Never resolves the path."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if path.is_symlink():
            return f"is a symbolic link to nothing ({os.readlink(path)})"
        if exc.errno == errno.EACCES:
            return "cannot be reached (permission denied on a directory on its way)"
        return "does not exist"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return None if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) else "is not a regular file"


def check_writable_dir(directory: Path, *, where: str, fix: str = "choose a writable directory") -> None:
    """Create ``directory`` if needed and prove a file can be written in it, before any expensive
    work whose result would go there; raise a StorageError naming ``where`` (the option or setting)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StorageError(f"{where}: cannot write into {directory} ({exc.strerror}); {fix}") from exc


def share_like_siblings(directory: Path) -> None:
    """Give every file of ``directory`` the mode a plain new file gets there (0644 under umask 022).

    Libraries that write through a private temporary file (safetensors' weights) leave it 0600,
    unreadable to the group that can read the rest of a checkpoint or export.
    """
    probe = directory / f".mode-probe-{os.getpid()}"
    probe.touch()
    try:
        mode = stat.S_IMODE(probe.stat().st_mode)
    finally:
        probe.unlink()
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != mode:
            path.chmod(mode)


class AtomicJsonl:
    """A JSON Lines file written row by row to a temporary file beside ``path`` (``.NAME.tmp-PID``)
    and renamed into place by :meth:`commit`; leaving the ``with`` block without a commit removes
    the temporary file, so ``path`` keeps its previous content (or stays absent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temp = temp_path(path)
        self.handle: IO[str] | None = None

    def __enter__(self) -> AtomicJsonl:
        with self._storage_errors():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = self.temp.open("w", encoding="utf-8")
        return self

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row, its credentials masked."""
        assert self.handle is not None, "write() inside the with block"
        with self._storage_errors():
            self.handle.write(redact(json.dumps(row, ensure_ascii=False)) + "\n")

    def flush(self) -> None:
        """Hand the rows written so far to the operating system."""
        assert self.handle is not None, "flush() inside the with block"
        with self._storage_errors():
            self.handle.flush()

    def commit(self) -> None:
        """Flush the rows to disk and rename the file into place."""
        assert self.handle is not None, "commit() once, inside the with block"
        with self._storage_errors():
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            self.handle = None
            os.replace(self.temp, self.path)

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()
        self.temp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise StorageError(f"cannot write {self.path} ({exc.strerror}); choose a writable location") from exc


def write_jsonl_atomic(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line, its credentials masked, through :class:`AtomicJsonl`: readers
    see the old file or the whole new one; return ``path``."""
    with AtomicJsonl(path) as out:
        for row in rows:
            out.write(row)
        out.commit()
    return path
