"""Writing files so that no reader sees half of one: small text files (configs, reports, JSON
summaries) at once, JSON Lines files row by row."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from rayft.errors import StorageError


def write_text_atomic(path: Path, text: str, *, where: str = "", fix: str = "choose a writable directory") -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename; return ``path``.

    The temporary file's name carries the process id, so that two processes writing the same file
    never write into one temporary file. ``where`` names the setting that chose the place (for
    example ``storage_path``) and ``fix`` what to do, both in the error raised when the write fails.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_beside(path)
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        prefix = f"{where}: " if where else ""
        raise StorageError(f"{prefix}cannot write {path} ({exc.strerror}); {fix}") from exc
    return path


def temp_beside(path: Path) -> Path:
    """The temporary file a write of ``path`` goes through: hidden, beside it, named by process id."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


class AtomicJsonl:
    """A JSON Lines file written row by row to a temporary file beside ``path`` (``.NAME.tmp-PID``)
    and renamed into place by :meth:`commit`; leaving the ``with`` block without a commit removes
    the temporary file, so ``path`` keeps its previous content (or stays absent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temp = temp_beside(path)
        self.handle: IO[str] | None = None

    def __enter__(self) -> AtomicJsonl:
        with self._storage_errors():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = self.temp.open("w", encoding="utf-8")
        return self

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row."""
        assert self.handle is not None, "write() inside the with block"
        with self._storage_errors():
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")

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
