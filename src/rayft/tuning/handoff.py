"""From a sweep to the pipeline's train stage: train the best trial's config, or reuse its model.

A pure decision: the best trial's finished model is reused when training its config again would
run the same training (same model, adapter, data, optimisation, workers and seed); otherwise the
train stage trains the best config from scratch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from rayft.tuning.results import TrialRecord

TRAINING_KEYS = ("model", "lora", "data", "train", "seed")
"""Top-level config sections that decide what a training run computes (plus scaling.num_workers)."""

CADENCE_KEYS = ("save_steps",)
"""``train`` fields that change when checkpoints are written, not what is trained (a trial saves at
every evaluation, since each one is a report to the scheduler)."""


@dataclasses.dataclass(frozen=True)
class TrainHandoff:
    """What the train stage does with the sweep's best trial, and why (logged and recorded)."""

    action: Literal["reuse", "train"]
    reason: str


def training_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a resolved config (as saved, a mapping) that decide what training computes."""
    scaling = config.get("scaling") or {}
    identity = {key: config.get(key) for key in TRAINING_KEYS}
    identity["train"] = {k: v for k, v in (identity["train"] or {}).items() if k not in CADENCE_KEYS}
    return {**identity, "num_workers": scaling.get("num_workers")}


def plan_handoff(
    best: TrialRecord,
    *,
    scheduler: str,
    trial_config: Mapping[str, Any] | None,
    wanted: Mapping[str, Any],
    trial_finished: bool,
) -> TrainHandoff:
    """Reuse the best trial's model, or train its config.

    Args:
        best: The sweep's best trial.
        scheduler: The sweep's scheduler (``pbt`` changes values during a trial).
        trial_config: The config saved in the trial's run directory (None when it has none).
        wanted: The config the train stage would run, as it is saved.
        trial_finished: Whether the trial's run directory holds a complete ``final/``.
    """
    where = f"trial {best.trial_id}"
    if best.status != "TERMINATED" or not trial_finished:
        return TrainHandoff("train", f"{where} did not train to the end ({best.status}, step {best.steps})")
    if scheduler == "pbt":
        return TrainHandoff(
            "reuse",
            f"{where}'s final model is reused: under pbt it was trained by its schedule of values "
            "(and exploited checkpoints), which a new run of its last values would not repeat",
        )
    if trial_config is None:
        return TrainHandoff("train", f"{where} saved no config.yaml to compare with")
    differ = sorted(k for k, v in training_identity(wanted).items() if training_identity(trial_config).get(k) != v)
    if differ:
        return TrainHandoff("train", f"{where} trained other settings than the train stage ({', '.join(differ)})")
    return TrainHandoff("reuse", f"{where} already trained this config to the end; its final model is reused")
