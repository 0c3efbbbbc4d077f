"""What a stage of ``rayft run`` is: the context it reads, the output it produces, and the protocol
every stage (:mod:`rayft.pipeline.stages`, :mod:`rayft.pipeline.tune_stage`) follows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rayft.config import RayftConfig
from rayft.runs.location import RunLocation
from rayft.runs.records import StageRecord


@dataclass(frozen=True)
class StageContext:
    """What every stage reads: the pipeline's config, its location (its directory, and its URI with
    a URI ``storage_path``), and the records of the stages finished so far in this run (earlier
    stages' outputs are the later ones' inputs)."""

    cfg: RayftConfig
    location: RunLocation
    records: dict[str, StageRecord]

    @property
    def run_dir(self) -> Path:
        """The pipeline's directory (the local mirror of a pipeline at a URI)."""
        return self.location.local_dir


@dataclass(frozen=True)
class StageOutput:
    """What a stage produced: its named files (absolute paths) and the summary its record keeps."""

    files: dict[str, Path]
    summary: dict[str, Any]


class Stage(Protocol):
    """One stage of the pipeline."""

    name: str

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """What the stage's fingerprint covers: it runs again when any of it changes."""

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Do the stage's work (``fresh``: an earlier finished output exists and is being redone)."""
