"""Writing small text files (configs, reports, JSON summaries) so that no reader sees half of one,
and none holds a credential."""

from __future__ import annotations

import os
from pathlib import Path

from rayft.errors import StorageError
from rayft.security import redact


def write_text_atomic(path: Path, text: str, *, where: str = "", fix: str = "choose a writable directory") -> Path:
    """Write ``text``, its credentials masked (:func:`rayft.security.redact`), to ``path`` through a
    temporary file beside it and a rename; return ``path``.

    The temporary file's name carries the process id, so that two processes writing the same file
    never write into one temporary file. ``where`` names the setting that chose the place (for
    example ``storage_path``) and ``fix`` what to do, both in the error raised when the write fails.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        temp.write_text(redact(text), encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        prefix = f"{where}: " if where else ""
        raise StorageError(f"{prefix}cannot write {path} ({exc.strerror}); {fix}") from exc
    return path
