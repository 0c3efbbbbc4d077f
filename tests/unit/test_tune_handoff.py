"""From a sweep to the train stage: reuse the best trial's model only when it is the same training."""

from __future__ import annotations

from typing import Any

from rayft.config import RayftConfig
from rayft.tuning.handoff import plan_handoff
from rayft.tuning.results import TrialRecord


def best(status: str = "TERMINATED") -> TrialRecord:
    return TrialRecord("t2", {"train.learning_rate": 3e-4}, 1.9, 1.9, 6, status, "finished", "runs/s/t2", [(6, 1.9)])  # type: ignore[arg-type]


def saved(**train: Any) -> dict[str, Any]:
    return RayftConfig(train={"learning_rate": 3e-4, **train}).model_dump(mode="json")


def test_same_training_is_reused_whatever_the_name_logging_and_checkpoint_cadence() -> None:
    trial = saved(save_steps=2) | {"name": "s-t2", "storage_path": "runs/s", "logging": {"console": False}}
    handoff = plan_handoff(best(), scheduler="asha", trial_config=trial, wanted=saved(), trial_finished=True)
    assert handoff.action == "reuse" and "trial t2 already trained this config" in handoff.reason


def test_other_settings_or_unfinished_trials_are_trained_again() -> None:
    other = plan_handoff(best(), scheduler="fifo", trial_config=saved(max_steps=3), wanted=saved(), trial_finished=True)
    assert (other.action, other.reason) == ("train", "trial t2 trained other settings than the train stage (train)")
    stopped = plan_handoff(
        best("STOPPED_EARLY"), scheduler="asha", trial_config=saved(), wanted=saved(), trial_finished=True
    )
    assert stopped.action == "train" and "did not train to the end (STOPPED_EARLY, step 6)" in stopped.reason
    no_final = plan_handoff(best(), scheduler="fifo", trial_config=saved(), wanted=saved(), trial_finished=False)
    assert no_final.action == "train"
    no_config = plan_handoff(best(), scheduler="fifo", trial_config=None, wanted=saved(), trial_finished=True)
    assert no_config.action == "train" and "no config.yaml" in no_config.reason


def test_pbt_reuses_the_model_its_schedule_made() -> None:
    handoff = plan_handoff(
        best(), scheduler="pbt", trial_config=saved(max_steps=3), wanted=saved(), trial_finished=True
    )
    assert handoff.action == "reuse" and "under pbt" in handoff.reason
