"""Writing small text files (configs, reports, JSON summaries) so that no reader sees half of one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rayft.errors import StorageError


def write_text_atomic(path: Path, text: str, *, where: str = "", fix: str = "choose a writable directory") -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename; return ``path``.

    The temporary file's name carries the process id, so that two processes writing the same file
    never write into one temporary file. ``where`` names the setting that chose the place (for
    example ``storage_path``) and ``fix`` what to do, both in the error raised when the write fails.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        prefix = f"{where}: " if where else ""
        raise StorageError(f"{prefix}cannot write {path} ({exc.strerror}); {fix}") from exc
    return path


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
