"""Pure planners of a training run: how many steps, when to evaluate and save, the learning rate
at each step, and whether the workers fit (which checkpoint to resume from and which to delete is
:mod:`rayft.runs.selection`).

Nothing here imports torch or ray; every function is unit-tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """The step geometry of a run, identical on every worker."""

    units_per_rank: int
    micro_batches_per_epoch: int
    steps_per_epoch: int
    total_steps: int
    dropped_units: int

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within that epoch) of optimizer step ``step`` (0-based)."""
        epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
        return epoch, step_in_epoch


def plan_schedule(  # noqa: PLR0917 - every argument is a plain number of the batch geometry
    num_units: int,
    world_size: int,
    micro_batch_size: int,
    grad_accum: int,
    num_epochs: int,
    max_steps: int | None,
) -> Schedule:
    """Plan the steps of a run from the dataset size and the batch geometry.

    Every rank gets ``num_units // world_size`` units per epoch (the split is equal, so that no
    rank waits for another at the end of an epoch; the remainder is reported as dropped). The last
    step of an epoch may hold fewer micro-batches than ``grad_accum``: every unit is used.

    Raises:
        ValueError: if there is not one unit per worker.
    """
    units_per_rank = num_units // max(world_size, 1)
    if units_per_rank == 0:
        raise ValueError(
            f"{num_units} training units cannot be split over {world_size} workers; "
            "use more data or fewer workers (scaling.num_workers)"
        )
    micro_batches = math.ceil(units_per_rank / micro_batch_size)
    steps_per_epoch = math.ceil(micro_batches / grad_accum)
    total = max_steps if max_steps is not None else steps_per_epoch * num_epochs
    return Schedule(units_per_rank, micro_batches, steps_per_epoch, total, num_units - units_per_rank * world_size)


def micro_batches_in_step(schedule: Schedule, step: int, grad_accum: int) -> int:
    """How many micro-batches optimizer step ``step`` (0-based) accumulates."""
    step_in_epoch = step % schedule.steps_per_epoch
    return min(grad_accum, schedule.micro_batches_per_epoch - step_in_epoch * grad_accum)


def units_before_step(schedule: Schedule, step: int, micro_batch_size: int, grad_accum: int) -> int:
    """Units each rank consumed in the current epoch before optimizer step ``step`` (0-based)."""
    step_in_epoch = step % schedule.steps_per_epoch
    return min(schedule.units_per_rank, step_in_epoch * grad_accum * micro_batch_size)


def learning_rate_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate at ``step``: linear warmup, then cosine to ``min_ratio``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def is_due(step: int, every: int | None, total_steps: int) -> bool:
    """Whether an action with period ``every`` runs after 1-based ``step`` (always after the last)."""
    return step == total_steps or (every is not None and step % every == 0)


def missing_resources(
    per_worker: Mapping[str, float], num_workers: int, nodes: Sequence[Mapping[str, float]]
) -> list[str]:
    """Why ``num_workers`` workers of ``per_worker`` resources cannot be placed on ``nodes``.

    Places workers greedily (largest node first) and reports what is short; an empty list means
    they fit. ``nodes`` are each node's total resources.
    """
    free = [dict(n) for n in sorted(nodes, key=lambda n: -n.get("CPU", 0.0))]
    placed = 0
    for _ in range(num_workers):
        node = next((n for n in free if all(n.get(k, 0.0) >= v for k, v in per_worker.items())), None)
        if node is None:
            break
        for key, value in per_worker.items():
            node[key] = node.get(key, 0.0) - value
        placed += 1
    if placed == num_workers:
        return []
    totals = {k: sum(n.get(k, 0.0) for n in nodes) for k in per_worker}
    wanted = {k: v * num_workers for k, v in per_worker.items()}
    short = [
        f"{k}: {_amount(k, wanted[k])} needed, {_amount(k, totals[k])} in the cluster"
        for k in per_worker
        if wanted[k] > totals[k]
    ]
    if not short:
        short = [f"no node can host a worker needing {dict(per_worker)} (only {placed} of {num_workers} fit)"]
    return short


def _amount(resource: str, value: float) -> str:
    """A resource quantity as people read it: memory in GiB (Ray counts bytes), the rest as numbers."""
    if resource in {"memory", "object_store_memory"}:
        return f"{value / 2**30:.1f} GiB"
    return f"{value:g}"
