"""Deciding where a model's files come from, without loading anything (a pure planner)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rayft.models.registry import BUILTIN_MODELS

SourceKind = Literal["builtin", "local", "gguf", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """Where to load a model from: ``location`` is a directory, a Hub id, or a built-in name."""

    kind: SourceKind
    location: str
    gguf_file: str | None = None
    revision: str | None = None


def resolve_model_source(name: str, gguf_file: str | None = None, revision: str | None = None) -> ModelSource:
    """Classify a model name: built-in offline name, .gguf path, local directory, or Hub id.

    ``org/name`` is a Hub id unless ``org`` is a directory here (then it is a path, even a missing one).
    """
    if name in BUILTIN_MODELS:
        return ModelSource("builtin", name)
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        return ModelSource("gguf", str(path.parent), gguf_file=path.name)
    if path.is_dir():
        kind: SourceKind = "gguf" if gguf_file else "local"
        return ModelSource(kind, str(path), gguf_file=gguf_file)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or _under_local_dir(path):
        return ModelSource("local", str(path), gguf_file=gguf_file)
    return ModelSource("hub", name, gguf_file=gguf_file, revision=revision)


def _under_local_dir(path: Path) -> bool:
    """``runs/my-run`` where ``runs/`` is a directory here: a path (missing or not), never a Hub id."""
    return len(path.parts) > 1 and Path(path.parts[0]).is_dir()


def anchored_name(name: str) -> str:
    """A model name whose relative local path is made absolute against this process's directory.

    Ray's workers run in a directory of their own, where a relative path names nothing (and would be
    taken for a Hub id); the driver anchors it before the name travels to them.
    """
    if name in BUILTIN_MODELS:
        return name
    path = Path(name).expanduser()
    if path.is_absolute() or not (path.is_dir() or (path.suffix == ".gguf" and path.is_file())):
        return name
    return str(path.resolve())
