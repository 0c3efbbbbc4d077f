"""Which pipeline stages run, which are skipped, and why: pure decisions, no I/O.

A stage is *requested* when its section (``sdg``, ``tune``, ``train``, ``pairs``, ``preference``, ``rl``,
``eval``, ``export``) is written in the config; a ``tune`` section also requests ``train``, which trains
the best trial's config, and a ``preference`` section requests ``pairs``, the pairs it trains on.
``--only`` and ``--from`` narrow the stages that may run; a stage that may run is skipped when its
recorded fingerprint equals the fingerprint of its inputs now, unless it is forced.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from rayft.errors import ConfigError, StorageError

STAGES = ("sdg", "tune", "train", "pairs", "preference", "rl", "eval", "export")
"""Every stage, in the order it runs."""

IMPLIES = {"tune": ("train",), "preference": ("pairs",)}
"""Stages a written section requests besides its own (a sweep is there to train its best trial;
preference training, to train on the pairs made just before it)."""

NEEDS = {
    "sdg": (),
    "tune": (),
    "train": (),
    "pairs": (),
    "preference": ("pairs",),
    "rl": (),
    "eval": (),
    "export": ("train",),
}
"""Stages whose outputs a stage cannot do without (eval compares with train when both are requested)."""

REMOTE_STAGES = ("train",)
"""Stages that can write to a URI ``storage_path`` (through a local mirror, uploaded as they go)."""

Action = Literal["run", "skip", "reuse", "failed"]


@dataclass(frozen=True)
class StageDecision:
    """What to do with one requested stage: run it, skip it (up to date), or reuse it untouched.

    ``failed`` marks, after the fact, a stage that was run and raised.
    """

    stage: str
    action: Action
    reason: str


def requested_stages(sections_set: Iterable[str]) -> list[str]:
    """The stages named in the config, in pipeline order; an error when it names none."""
    written = set(sections_set)
    written |= {implied for s in STAGES if s in written for implied in IMPLIES.get(s, ())}
    stages = [s for s in STAGES if s in written]
    if not stages:
        raise ConfigError(
            "the config names no pipeline stage; add at least one of the sections "
            f"{', '.join(STAGES)} (an empty section like `eval: {{}}` takes the defaults)"
        )
    if {"preference", "rl"} <= written:
        raise ConfigError(
            "the config has both an rl and a preference section: rayft run trains one of them after SFT; remove one"
        )
    missing = [(s, n) for s in stages for n in NEEDS[s] if n not in written]
    if missing:
        stage, need = missing[0]
        raise ConfigError(f"stage {stage!r} needs the {need!r} stage's output; add a `{need}:` section to the config")
    return stages


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


def check_remote_stages(requested: Iterable[str], where: str) -> None:
    """Refuse, before anything runs, stages that cannot write to the URI ``where`` (they would
    silently write only to the local mirror)."""
    local_only = [s for s in requested if s not in REMOTE_STAGES]
    if local_only:
        names = ", ".join(local_only)
        sections = ", ".join(f"`{s}:`" for s in local_only)
        raise StorageError(
            f"storage_path {where}: the {names} stage(s) of `rayft run` write only to a local directory or shared "
            f"mount, not to a URI. Use a local storage_path (or the bucket mounted as a directory), or train only "
            f"with this URI: remove the {sections} section(s), or use `rayft train`"
        )
