"""What the driver decides for every worker of a run: a picklable value with no live objects.

The recipes build it, the launchers (Ray Train, ``torchrun``) carry it to the workers, and
:func:`rayft.training.loop.worker.run_worker` carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rayft.config.model import LoraConfig, ModelConfig
from rayft.config.task import TaskConfig
from rayft.config.train import CheckpointConfig, LoggingConfig, TrainConfig
from rayft.runs.location import RunLocation
from rayft.training.loop.plan import Schedule
from rayft.training.modeling.step_choice import StepChoice


@dataclass(frozen=True)
class WorkerPlan:
    """Everything a worker needs, decided on the driver (picklable, no live objects)."""

    model: ModelConfig
    lora: LoraConfig
    train: TrainConfig
    logging: LoggingConfig
    checkpoint: CheckpointConfig
    seed: int
    # Where this worker writes the run (``location.local_dir``) and, for a run at a URI, its durable
    # home, where checkpoints and final/ go too.
    location: RunLocation
    resolved_config: str
    schedule: Schedule
    shuffle_window: int
    has_validation: bool
    lineage: dict[str, Any] = field(default_factory=dict)
    # Continue from the checkpoint with this plan's optimiser settings (learning rate, weight decay)
    # instead of the ones saved in it: a trial of a sweep that took another trial's checkpoint.
    retuned: bool = False
    task: TaskConfig | None = None  # a custom task (its path made absolute for the workers) instead of model/data
    tracker_ids: dict[str, Any] = field(default_factory=dict)  # the tracker runs to log into (tracking.json)
    max_seq_length: int = 1024  # data.max_seq_length: the longest row, for the step's planner
    packing: bool = False  # data.packing

    def with_step(self, choice: StepChoice) -> WorkerPlan:
        """This plan with the step's ``auto`` settings replaced by what the planner chose, so that every
        later reader (model build, collation, loss, precision) sees the decided values."""
        model = self.model.model_copy(update={"attn_implementation": choice.attention})
        train = self.train.model_copy(update={
            "fused_loss": choice.loss, "compile": choice.compile, "mixed_precision": choice.mixed_precision,
            "cpu_threads": choice.threads if choice.threads is not None else self.train.cpu_threads,
            "padding_free": choice.padding_free, "frozen_precision": choice.frozen_precision,
        })  # fmt: skip
        return replace(self, model=model, train=train)

    @property
    def run_dir(self) -> Path:
        """The directory this worker writes the run into (``location.local_dir``)."""
        return self.location.local_dir
