"""What the training loop trains: the one seam between the shared loop and a training method.

The loop (:mod:`rayft.training.loop.worker`) owns the workers, the data order, the optimizer and
schedule, checkpoints, resume and logging. A :class:`Method` owns what depends on the method: how its
model is built (or restored) and written, how units become a micro-batch, how a step's micro-batches
become what it trains on (GRPO samples and scores completions of its prompts), the loss, how many
updates a step takes, and its figures. The loop never asks which method it runs: the methods live in
``rayft.training.methods`` (one folder per family), above the loop, which never imports them; their
registry (:mod:`rayft.training.methods.registry`) hands the loop a :class:`MethodCatalog`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    import torch

    from rayft.training.loop.batches import Batch, TrainBatch, Unit
    from rayft.training.loop.checkpointing import ModelFiles
    from rayft.training.loop.session import TrainSession
    from rayft.training.loop.worker_plan import WorkerPlan
    from rayft.training.modeling.precision import Precision
    from rayft.training.strategies.parallel import Parallelism


class Method(Protocol):
    """A training method as the loop calls it (:class:`MethodHooks` gives the hooks most methods leave be)."""

    @property
    def throughput_unit(self) -> str:
        """What ``train/<unit>_per_s`` counts: 'tokens' or 'examples'."""
        ...

    @property
    def model_type(self) -> str:
        """The transformers model type ('t5', 'llama'; '' for a task), for the precision checks."""
        ...

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates on each step's batches (GRPO's ``train.rl.steps_per_rollout``; else 1)."""
        ...

    @property
    def lookahead(self) -> int:
        """How many later steps' micro-batches :meth:`prepare` is shown (those asynchronous rollouts sample)."""
        ...

    @property
    def prepare_phase(self) -> str | None:
        """The step-profile phase :meth:`prepare`'s time counts in ('rollout'), None when it takes none."""
        ...

    def phase_parts(self) -> dict[str, float]:
        """Seconds of parts of the last :meth:`prepare` (GRPO's episodes: ``rollout_sample``, ``rollout_tools``),
        reported beside its phase; taken (the next call starts from nothing)."""
        ...

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The model to train (on the CPU or the meta device), restored from ``restore_dir`` if given."""
        ...

    def restore(self, restore_dir: Path | None, rank: int) -> None:
        """Read this rank's state of the method from the checkpoint the run resumes from (None: a fresh run)."""
        ...

    def use_strategy(self, parallel: Parallelism) -> None:
        """The run's strategy, once it has prepared the model (GRPO gathers sharded weights to sample with)."""
        ...

    def start(self, session: TrainSession) -> None:
        """Start what the method keeps beside the model for the run (GRPO's generation actors)."""
        ...

    def collate(self, units: list[Unit]) -> Batch:
        """One micro-batch: a :class:`~rayft.training.loop.batches.TrainBatch` (``num_label_tokens`` is the
        number of loss terms), or what :meth:`prepare` turns into some (GRPO's prompts)."""
        ...

    def prepare(
        self, model: torch.nn.Module, batches: list[Batch], ahead: list[list[Batch]], *, step: int,
        precision: Precision, device: torch.device,
    ) -> list[TrainBatch]:  # fmt: skip
        """What step ``step`` trains on (on ``device``), from its collated micro-batches (``ahead``: the
        next :attr:`lookahead` steps')."""
        ...

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The sum of the micro-batch's ``num_label_tokens`` loss terms (``batch``: one this method made)."""
        ...

    def after_update(self, model: torch.nn.Module, step: int) -> None:
        """After the optimizer update of step ``step`` (not the last): GRPO sends its actors the new weights."""
        ...

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """The method's figures since the last call over every rank, and reset (every rank joins);
        ``units``: every rank's loss terms since then."""
        ...

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Figures over every worker's validation units, ``eval/loss`` first (every rank joins)."""
        ...

    @property
    def rank_state(self) -> Callable[[], str | None] | None:
        """What gives this rank's state of the method at each checkpoint save (GRPO's rollouts sampled
        ahead), None for a method that keeps none (the save then gathers nothing)."""
        ...

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """The model files of a checkpoint or of ``final/`` (``state_dict``: a snapshot to write
        instead of the live weights)."""
        ...

    def close(self) -> None:
        """Stop what :meth:`start` started."""
        ...


class MethodHooks:
    """The hooks of a method that trains once per step on its collated micro-batches, keeps nothing beside
    the model and has no figures of its own: a method inherits them and overrides what it does."""

    @property
    def updates_per_step(self) -> int:
        """One update per step."""
        return 1

    @property
    def lookahead(self) -> int:
        """No later step's batches."""
        return 0

    @property
    def prepare_phase(self) -> str | None:
        """No preparation to time."""
        return None

    def phase_parts(self) -> dict[str, float]:
        """No parts."""
        return {}

    def restore(self, restore_dir: Path | None, rank: int) -> None:
        """Nothing to read."""

    def use_strategy(self, parallel: Parallelism) -> None:
        """Nothing to keep: the loop runs the strategy."""

    def start(self, session: TrainSession) -> None:
        """Nothing to start."""

    def prepare(
        self, model: torch.nn.Module, batches: list[Batch], ahead: list[list[Batch]], *, step: int,
        precision: Precision, device: torch.device,
    ) -> list[TrainBatch]:  # fmt: skip
        """The collated micro-batches themselves (already on the device)."""
        return cast_train(batches)

    def after_update(self, model: torch.nn.Module, step: int) -> None:
        """Nothing to send."""

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """None."""
        return {}

    @property
    def rank_state(self) -> Callable[[], str | None] | None:
        """None: nothing kept."""
        return None

    def close(self) -> None:
        """Nothing to stop."""


def cast_train(batches: Sequence[Batch]) -> list[TrainBatch]:
    """``batches`` as the micro-batches a step trains on: a method whose collate makes them directly."""
    return cast("list[TrainBatch]", list(batches))


@dataclass(frozen=True)
class MethodTraits:
    """What the loop needs to know of a method before it is built: the step planner's facts and the
    model files' rules."""

    token_loss: bool = False  # its loss is the next-token loss alone (the planner may fuse it or unpad its rows)
    reference_copy: bool = False  # it scores against a frozen copy of the model, kept in fp32
    untrained_allowed: bool = False  # a run may end with the weights it started from (GRPO: no reward spread)


class MethodCatalog(Protocol):
    """How the loop gets the method a plan names (:mod:`rayft.training.methods.registry`)."""

    def traits(self, plan: WorkerPlan) -> MethodTraits:
        """The plan's method's traits."""
        ...

    def build(self, plan: WorkerPlan, files: ModelFiles) -> Method:
        """The plan's method (``files``: what its checkpoints write beside the weights)."""
        ...
