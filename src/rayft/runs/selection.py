"""Which checkpoint of a run to use: pure decisions over what a store lists, no I/O.

``latest``, ``best``, ``final`` and ``step-N`` for the readers of a run (eval, compare, export);
the checkpoint a run resumes from and the ones retention deletes for the writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rayft.errors import CheckpointError
from rayft.runs import layout


@dataclass(frozen=True)
class CheckpointInfo:
    """What a planner needs to know of a checkpoint on storage."""

    name: str
    step: int
    complete: bool
    eval_loss: float | None = None


def choose_resume(checkpoints: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
    """The checkpoint a run resumes from: the complete one with the highest step."""
    complete = [c for c in checkpoints if c.complete]
    return max(complete, key=lambda c: c.step, default=None)


def plan_retention(checkpoints: Sequence[CheckpointInfo], num_to_keep: int | None) -> list[CheckpointInfo]:
    """Checkpoints to delete: keep the latest, plus the ``num_to_keep`` best by validation loss
    (or the newest when none has one); incomplete ones are always deleted."""
    doomed = [c for c in checkpoints if not c.complete]
    complete = sorted((c for c in checkpoints if c.complete), key=lambda c: c.step)
    if num_to_keep is None or not complete:
        return doomed
    latest = complete[-1]
    ranked = sorted(complete, key=lambda c: (c.eval_loss is None, c.eval_loss or 0.0, -c.step))
    keep = {latest.name, *(c.name for c in ranked[:num_to_keep])}
    return doomed + [c for c in complete if c.name not in keep]


def choose_checkpoint(checkpoints: Sequence[CheckpointInfo], final: CheckpointInfo | None, selector: str) -> str:
    """The checkpoint of a run that ``selector`` names (``latest``, ``best``, ``final``, ``step-N``).

    Returns a path relative to the run directory. Only complete checkpoints count.

    Raises:
        CheckpointError: naming the selector and what the run has (not the setting that gave it: the
            command-line option --checkpoint or the config's eval.checkpoint).
    """
    complete = [c for c in checkpoints if c.complete]
    have = ", ".join(c.name for c in complete) or "no complete checkpoint"
    have += "; final/" if final is not None and final.complete else ""
    if selector == "final" or (selector == "latest" and final is not None and final.complete):
        if final is None or not final.complete:
            raise CheckpointError(
                f"checkpoint 'final': the run has no complete final/ (it has: {have}); pick one it has"
            )
        return layout.FINAL_DIR
    if selector == "latest":
        if not complete:
            raise CheckpointError(f"checkpoint 'latest': the run has {have}; train it first")
        return f"{layout.CHECKPOINTS_DIR}/{max(complete, key=lambda c: c.step).name}"
    if selector == "best":
        ranked = [c for c in [*complete, *([final] if final and final.complete else [])] if c.eval_loss is not None]
        if not ranked:
            raise CheckpointError(
                f"checkpoint 'best': no checkpoint of the run has an eval/loss (it has: {have}); the run had "
                "no validation data, so use latest or step-N"
            )
        best = min(ranked, key=lambda c: (c.eval_loss, -c.step))
        return layout.FINAL_DIR if best is final else f"{layout.CHECKPOINTS_DIR}/{best.name}"
    wanted = layout.parse_step_dir_name(selector)
    match = next((c for c in complete if c.step == wanted), None)
    if match is None:
        raise CheckpointError(
            f"checkpoint {selector!r}: the run has no complete checkpoint {selector} (it has: {have}); pick one it has"
        )
    return f"{layout.CHECKPOINTS_DIR}/{match.name}"
