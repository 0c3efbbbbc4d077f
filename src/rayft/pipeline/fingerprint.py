"""Fingerprints: stable hashes of configs, files and directories that identify a stage's inputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def hash_object(value: Any) -> str:
    """The sha256 of a JSON-able value in canonical form (sorted keys, no whitespace)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hash_file(path: Path) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(root: Path, *, skip: tuple[str, ...] = ()) -> str:
    """The sha256 of a directory: every file's relative path and content, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(skip):
            continue
        digest.update(relative.encode("utf-8") + b"\0" + hash_file(path).encode("ascii") + b"\n")
    return digest.hexdigest()


def hash_path(path: Path) -> str:
    """The sha256 of a file or a directory tree."""
    return hash_tree(path) if path.is_dir() else hash_file(path)
