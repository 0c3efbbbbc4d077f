"""Which checkpoint of a run to use: pure decisions over what a store lists, no I/O.

``latest``, ``best``, ``final`` and ``step-N`` for the readers of a run (eval, compare, export);
the checkpoint a run resumes from and the ones retention deletes for the writer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rayft.errors import CheckpointError
from rayft.runs import layout

UNREADABLE_SUFFIX = ".unreadable"
"""Appended to the name of a checkpoint set aside: not a ``step-N`` name, so no reader picks it up."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a planner needs to know of a checkpoint on storage.

    ``complete``: its commit marker (the manifest, written last) is there and readable.
    ``unreadable``: the marker is there but cannot be read. The save was committed, so the checkpoint
    is never deleted: it is set aside for a person to look at, and the run falls back past it.
    """

    name: str
    step: int
    complete: bool
    eval_loss: float | None = None
    unreadable: bool = False

    @property
    def committed(self) -> bool:
        """Whether its save reached the commit point (the marker exists, readable or not)."""
        return self.complete or self.unreadable


@dataclass(frozen=True)
class CleanupPlan:
    """What a resume clears from a checkpoints folder: saves that never committed are removed,
    committed checkpoints whose marker cannot be read are set aside (renamed, never deleted)."""

    remove: list[CheckpointInfo]
    set_aside: list[CheckpointInfo]


def plan_cleanup(checkpoints: Sequence[CheckpointInfo]) -> CleanupPlan:
    """Which checkpoints a resume removes (no commit marker) and which it sets aside (a marker that
    cannot be read)."""
    return CleanupPlan(
        remove=[c for c in checkpoints if not c.committed],
        set_aside=[c for c in checkpoints if c.unreadable],
    )


def set_aside_name(name: str, taken: Collection[str]) -> str:
    """The name a checkpoint set aside gets: ``step-000010.unreadable``, numbered when taken."""
    candidate, number = f"{name}{UNREADABLE_SUFFIX}", 1
    while candidate in taken:
        number += 1
        candidate = f"{name}{UNREADABLE_SUFFIX}-{number}"
    return candidate


def choose_resume(checkpoints: Sequence[CheckpointInfo]) -> CheckpointInfo | None:
    """The checkpoint a run resumes from: the complete one with the highest step."""
    complete = [c for c in checkpoints if c.complete]
    return max(complete, key=lambda c: c.step, default=None)


def plan_retention(checkpoints: Sequence[CheckpointInfo], num_to_keep: int | None) -> list[CheckpointInfo]:
    """Checkpoints to delete: keep the latest, plus the ``num_to_keep`` best by validation loss
    (or the newest when none has one); incomplete ones are always deleted, and committed ones whose
    marker cannot be read never are (:func:`plan_cleanup` sets them aside)."""
    doomed = [c for c in checkpoints if not c.committed]
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
