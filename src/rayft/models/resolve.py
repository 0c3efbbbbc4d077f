"""Deciding where a model's files come from, without loading anything (a pure planner)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
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


SourceKey = tuple[str, str | None, str | None]
"""What a source is resolved from: the model name, its .gguf file and its revision."""

# The sources resolved so far in the run this context is in (None: outside a run). Memoised rather
# than passed: a run asks for its model's source in a dozen places (the data cache key, the tokenizer,
# the architecture, the step planner, the model load), each taking a ModelConfig from callers well
# beyond training (generation, evaluation, export, serving); threading a resolved source through all
# of them would change every one of those signatures for a value that cannot change during one run.
# Scoped to a run, not to the process: a name's kind depends on the directories that exist, and a
# long-lived process (a notebook, the pipeline between stages) may create a model directory later.
_RUN_SOURCES: ContextVar[dict[SourceKey, ModelSource] | None] = ContextVar("rayft_run_model_sources", default=None)


@contextlib.contextmanager
def sources_resolved_once() -> Iterator[None]:
    """Within the block (one run: its driver, or one worker), each model source is resolved once and
    the same :class:`ModelSource` handed to every later :func:`resolve_model_source` of it. A block
    inside another shares the outer one's sources (an in-process worker inside its driver)."""
    if _RUN_SOURCES.get() is not None:
        yield
        return
    token = _RUN_SOURCES.set({})
    try:
        yield
    finally:
        _RUN_SOURCES.reset(token)


def resolve_model_source(name: str, gguf_file: str | None = None, revision: str | None = None) -> ModelSource:
    """Where the model ``name`` comes from (:func:`classify_model_source`), once per run inside
    :func:`sources_resolved_once`."""
    sources = _RUN_SOURCES.get()
    if sources is None:
        return classify_model_source(name, gguf_file, revision)
    key = (name, gguf_file, revision)
    if key not in sources:
        sources[key] = classify_model_source(name, gguf_file, revision)
    return sources[key]


def classify_model_source(name: str, gguf_file: str | None = None, revision: str | None = None) -> ModelSource:
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
