"""``rayft train CONFIG``: supervised fine-tuning of a causal LM on Ray Train.

Reads top to bottom: where the run lives (its directory, or its URI and local mirror), which
launcher runs the workers (in this process for ``num_workers: 0``, else Ray Train), then the
training driver (:func:`rayft.training.driver.run.drive`: lock, claim, data, plan, trackers, workers,
results).
"""

from __future__ import annotations

from pathlib import Path

from rayft.config import RayftConfig
from rayft.models.architecture import refuse_quantize_widths
from rayft.models.resolve import sources_resolved_once
from rayft.training.driver.run import RunStart, TrainResult, default_launcher, drive
from rayft.training.driver.startup import run_location

__all__ = ["TrainResult", "run"]


def run(cfg: RayftConfig, *, resume: bool = False, mirror_dir: Path | None = None) -> TrainResult:
    """Fine-tune ``cfg.model`` on ``cfg.data`` and write the run directory, holding its lock throughout.

    Args:
        cfg: The resolved config.
        resume: Continue the run of the same name from its newest complete checkpoint.
        mirror_dir: Where the local mirror of a remote run goes (default: under the cache).
    """
    with sources_resolved_once():
        if cfg.task.path is None:  # a custom task's model is no transformers model: it has no widths to check
            refuse_quantize_widths(cfg.model, cfg.lora.quantize)
        location = run_location(cfg, mirror_dir)
        return drive(cfg, default_launcher(cfg), location, start=RunStart(resume=resume))
