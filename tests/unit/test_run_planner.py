"""The start / resume / refuse planner of a run, for `rayft train` and for `rayft run`'s train stage:
pure decisions over what a store holds, tested without Ray or storage."""

from __future__ import annotations

from typing import Any

import pytest

from rayft.errors import ConfigError, RunStateError
from rayft.runs.planner import RunState, plan_stage_start, plan_train_start

WHERE = "s3://bucket/runs/demo"
CFG: dict[str, Any] = {"train": {"learning_rate": 2e-4, "max_steps": 10}, "scaling": {"num_workers": 2}}
FRESH = RunState(exists=False, finished=False)
UNFINISHED = RunState(exists=True, finished=False, steps=(2, 4))
FINISHED = RunState(exists=True, finished=True, steps=(2, 4))


def changed(**train: Any) -> dict[str, Any]:
    return {**CFG, "train": {**CFG["train"], **train}}


def train_start(state: RunState, saved: dict[str, Any] | None, wanted: dict[str, Any], *, resume: bool) -> str:
    return plan_train_start(WHERE, "demo", state, saved, wanted, resume=resume).action


def test_train_starts_a_fresh_run_and_resumes_an_unfinished_one() -> None:
    assert train_start(FRESH, None, CFG, resume=False) == "start"
    plan = plan_train_start(WHERE, "demo", UNFINISHED, CFG, changed(max_steps=50), resume=True)
    assert (plan.action, plan.reason) == ("resume", "resuming from step 4")


@pytest.mark.parametrize(
    ("state", "resume", "message"),
    [
        (FRESH, True, r"--resume: there is no run at s3://bucket/runs/demo to resume; drop --resume"),
        (FINISHED, False, r"run 'demo' already finished \(s3://bucket/runs/demo/final exists\); .*name=demo-2"),
        (FINISHED, True, r"already finished .* or delete s3://bucket/runs/demo"),
        (UNFINISHED, False, r"already exists at .* \(checkpoints up to step 4\); rerun with --resume"),
        (RunState(True, False, logged=True), False, r"already exists at .* \(no checkpoint yet\)"),
    ],
)
def test_train_refuses_with_the_fix(state: RunState, resume: bool, message: str) -> None:
    with pytest.raises(RunStateError, match=message):
        train_start(state, CFG, CFG, resume=resume)


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_whose_start_failed_before_it_trained_a_step_is_started_again(resume: bool) -> None:
    """A bad data path, model or tracker leaves config.yaml behind: the corrected command (with or
    without --resume, with the settings changed) starts the run again instead of being refused."""
    saved, wanted = {**CFG, "name": "demo"}, {**changed(learning_rate=1.0), "name": "demo"}
    plan = plan_train_start(WHERE, "demo", RunState(exists=True, finished=False), saved, wanted, resume=resume)
    assert plan.action == "restart"
    assert "stopped before it trained a step" in plan.reason


def test_a_directory_whose_config_is_not_this_runs_is_never_started_over() -> None:
    """A config.yaml rayft did not write for this run (another tool's, in a directory that happens to
    have the run's name) is refused as before, never cleared."""
    with pytest.raises(RunStateError, match="already exists"):
        plan_train_start(WHERE, "demo", RunState(exists=True, finished=False), {"model": "theirs"},
                         {**CFG, "name": "demo"}, resume=False)  # fmt: skip


def test_resume_allows_schedule_and_scaling_changes_only() -> None:
    wanted = {**changed(max_steps=99), "scaling": {"num_workers": 8}}
    assert train_start(UNFINISHED, CFG, wanted, resume=True) == "resume"
    with pytest.raises(ConfigError, match=r"--resume with a different config: train.learning_rate: 0.0002 -> 0.001"):
        train_start(UNFINISHED, CFG, changed(learning_rate=1e-3), resume=True)
    with pytest.raises(ConfigError, match=r"model.name: None -> 'other'"):
        train_start(UNFINISHED, CFG, {**CFG, "model": {"name": "other"}}, resume=True)


@pytest.mark.parametrize(
    ("state", "saved", "can_replace", "action"),
    [
        (FRESH, None, True, "start"),
        (UNFINISHED, CFG, True, "resume"),
        (FINISHED, CFG, True, "keep"),
        (FINISHED, CFG, False, "keep"),
        (UNFINISHED, CFG, False, "resume"),
        (UNFINISHED, changed(max_steps=99), True, "replace"),
        (FINISHED, changed(learning_rate=1.0), True, "replace"),
    ],
)
def test_the_pipeline_keeps_resumes_or_replaces(
    state: RunState, saved: dict[str, Any] | None, can_replace: bool, action: str
) -> None:
    plan = plan_stage_start(WHERE, "p", state, saved, CFG, can_replace=can_replace)
    assert plan.action == action


def test_the_pipeline_refuses_other_settings_where_the_run_cannot_be_kept_aside() -> None:
    with pytest.raises(
        RunStateError, match=r"stage train: s3://.* holds a training run with other settings; .*name=p-2"
    ):
        plan_stage_start(WHERE, "p", FINISHED, changed(max_steps=99), CFG, can_replace=False)
