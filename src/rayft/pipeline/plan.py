"""Which pipeline stages run, which are skipped, and why: pure decisions, no I/O.

A stage is *requested* when its section (``sdg``, ``tune``, ``train``, ``pairs``, ``preference``, ``rl``,
``eval``, ``export``) is written in the config; a ``tune`` section also requests ``train``, which trains
the best trial's config, and a ``preference`` section requests ``pairs``, the pairs it trains on.
``--only`` and ``--from`` narrow the stages that may run; a stage that may run is skipped when its
recorded fingerprint equals the fingerprint of its inputs now, unless it is forced.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from rayft.config.checks import (  # the stage tables and checks live with the config's other checks
    IMPLIES,
    NEEDS,
    REMOTE_STAGES,
    STAGES,
    check_remote_stages,
    requested_stages,
)
from rayft.errors import ConfigError

Action = Literal["run", "skip", "reuse", "failed"]


@dataclass(frozen=True)
class StageDecision:
    """What to do with one requested stage: run it, skip it (up to date), or reuse it untouched.

    ``failed`` marks, after the fact, a stage that was run and raised.
    """

    stage: str
    action: Action
    reason: str


def runnable_stages(requested: list[str], *, from_stage: str | None, only: str | None) -> tuple[list[str], set[str]]:
    """The stages allowed to run and the stages forced to run, given ``--from`` and ``--only``."""
    if from_stage and only:
        raise ConfigError("--from and --only cannot be combined; use one of them")
    for flag, stage in (("--from", from_stage), ("--only", only)):
        if stage is not None and stage not in requested:
            raise ConfigError(
                f"{flag} {stage}: the config does not request that stage; requested stages are {', '.join(requested)}"
            )
    if only:
        return [only], {only}
    if from_stage:
        later = requested[requested.index(from_stage) :]
        return later, set(later)
    return list(requested), set()


def decide(
    stage: str, fingerprint: str, recorded: str | None, *, allowed: Collection[str], forced: Collection[str]
) -> StageDecision:
    """Decide one stage from its fingerprint now and the one recorded with its outputs (None if none).

    A stage that ``--from``/``--only`` leaves out keeps its outputs; one without outputs is an error
    when a selected stage comes after it (it may need them), and is left alone when none does."""
    if stage not in allowed:
        if recorded is None and STAGES.index(stage) > max(STAGES.index(s) for s in allowed):
            return StageDecision(stage, "skip", "not selected by --from/--only (no output yet)")
        if recorded is None:
            raise ConfigError(
                f"stage {stage!r} has no finished output in this run directory, and a later stage needs it; "
                f"run the pipeline without --from/--only first"
            )
        return StageDecision(stage, "reuse", "outputs kept (not selected by --from/--only)")
    if stage in forced:
        return StageDecision(stage, "run", "forced")
    if recorded is None:
        return StageDecision(stage, "run", "no finished output yet")
    if recorded == fingerprint:
        return StageDecision(stage, "skip", f"up to date (fingerprint {fingerprint[:12]})")
    return StageDecision(stage, "run", f"inputs changed (fingerprint {recorded[:12]} -> {fingerprint[:12]})")


__all__ = [
    "IMPLIES", "NEEDS", "REMOTE_STAGES", "STAGES", "Action", "StageDecision", "check_remote_stages", "decide",
    "requested_stages", "runnable_stages",
]  # fmt: skip
