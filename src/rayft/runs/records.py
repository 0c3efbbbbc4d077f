"""Stage records: the file written last when a pipeline stage finishes (``stages/<stage>.json`` in the
run directory), naming its inputs' fingerprint, its outputs and a summary. No record: not finished.

They live beside the run layout (not in :mod:`rayft.pipeline`) because readers below the pipeline
need them too: ``rayft serve runs/quickstart`` serves a pipeline directory's final model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rayft.files import write_text_atomic
from rayft.runs import layout

RECORDS_DIR = layout.STAGE_RECORDS_DIR


@dataclass(frozen=True)
class StageRecord:
    """What a finished stage recorded: fingerprint, inputs, outputs (paths relative to the run dir)."""

    stage: str
    fingerprint: str
    inputs: dict[str, Any]
    outputs: dict[str, str]
    summary: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    elapsed_s: float = 0.0

    def output(self, run_dir: Path, name: str) -> Path:
        """The absolute path of one named output."""
        return run_dir / self.outputs[name]


def record_path(run_dir: Path, stage: str) -> Path:
    """Where a stage's record lives in the run directory."""
    return run_dir / RECORDS_DIR / f"{stage}.json"


def write_record(run_dir: Path, record: StageRecord) -> Path:
    """Write the record atomically (temp file, then rename): a crash leaves the old one or none."""
    target = record_path(run_dir, record.stage)
    return write_text_atomic(target, json.dumps(asdict(record), indent=2, sort_keys=True, default=str))


def read_record(run_dir: Path, stage: str) -> StageRecord | None:
    """The record of a finished stage, or None when the stage never finished in this run directory."""
    path = record_path(run_dir, stage)
    if not path.is_file():
        return None
    try:
        return StageRecord(**json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError):
        return None


def outputs_exist(run_dir: Path, record: StageRecord) -> bool:
    """Whether every output the record names is still there."""
    return all((run_dir / rel).exists() for rel in record.outputs.values())


def trained_final(run_dir: Path, records: dict[str, StageRecord]) -> Path | None:
    """The pipeline's last trained model (RL's or preference training's final/, else SFT's), or None."""
    stage = next((s for s in layout.TRAINED_STAGES if s in records), None)
    return records[stage].output(run_dir, "final") if stage is not None else None
