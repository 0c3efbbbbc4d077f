"""What an export will do, decided before any model loads: which checkpoint, of which kind, into
which directory, merged or not. Refuses a source that is not a training checkpoint and a target
that already holds something, so that a bad command fails in a second, not after a model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rayft.config.model import ModelConfig
from rayft.errors import ConfigError, RunStateError
from rayft.models.sources import ResolvedSource, resolve_source

_SOURCES = "give a run directory, a checkpoints/step-N directory or a final/ directory"


@dataclass(frozen=True)
class ExportPlan:
    """The resolved checkpoint, the directory the export becomes, and whether a LoRA adapter is merged."""

    source: ResolvedSource
    target: Path
    merge: bool

    @property
    def merged(self) -> bool:
        """Whether the export holds merged weights (a LoRA checkpoint exported with ``merge``)."""
        return self.source.kind == "lora" and self.merge

    @property
    def kind(self) -> str:
        """The checkpoint's kind: ``lora`` or ``full``."""
        return self.source.kind


def plan_export(source: str, output_dir: Path, model: ModelConfig, checkpoint: str, *, merge: bool) -> ExportPlan:
    """The plan for exporting ``source`` (a run directory's ``checkpoint``, or a checkpoint) to ``output_dir``.

    Raises:
        ConfigError: ``source`` is not a directory, or is a model rather than a training checkpoint.
        RunStateError: ``output_dir`` exists and is not an empty directory.
    """
    if not Path(source).expanduser().is_dir():
        raise ConfigError(f"export: {source!r} does not exist or is not a directory; {_SOURCES}")
    resolved = resolve_source(source, model, checkpoint)
    if resolved.kind == "model":
        raise ConfigError(f"export: {source!r} is a model, not a training checkpoint; {_SOURCES}")
    target = Path(output_dir).expanduser().resolve()
    check_target(target)
    return ExportPlan(resolved, target, merge)


def check_target(target: Path) -> None:
    """Refuse a target that exists and is not an empty directory (an export never overwrites)."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RunStateError(f"export: {target} already exists and is not empty; choose a new directory or delete it")
