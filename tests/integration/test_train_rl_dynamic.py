"""DAPO's dynamic sampling end to end on a tiny random model: a run that refills its steps records what it
drew, dropped and sampled extra, and a run resumed from a checkpoint taken after refills (the refill
stream's cursor in the middle of the shard) equals the uninterrupted run, with CISPO, REINFORCE++-baseline,
overlong filtering and the soft overlong punishment on.

The reward is whether a completion starts with a digit: a random model does so now and then, so some groups
score alike (dropped) and others do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.data.prepared import PreparedData
from tests.integration.test_train_rl import rl_config
from tests.support.runs import crashed_copy, read_metrics, train_losses, train_on

pytestmark = pytest.mark.integration

DYNAMIC = ("scaling.num_workers=0", "train.max_steps=4", "train.save_steps=2", "train.learning_rate=5e-2",
           "train.rl.rewards=[{function: regex, pattern: '^\\s*[0-9]'}]",
           "train.rl.dynamic_sampling={max_rounds: 2}", "train.rl.loss=cispo",
           "train.rl.advantage=reinforce_pp_baseline", "train.rl.mask_truncated=true",
           "train.rl.overlong_buffer=4")  # fmt: skip
RECORD = ("rl/groups_drawn", "rl/groups_dropped", "rl/groups_trained", "rl/extra_rollouts", "rl/refill_rounds",
          "rl/short_steps", "rl/reward", "rl/truncated", "rl/overlong_penalty", "rl/prompts_all_solved",
          "rl/prompts_none_solved")  # fmt: skip


@pytest.fixture(scope="module")
def prompts(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(rl_config(tiny_model_dir, tmp_path_factory.mktemp("prep")), None, use_ray=True)


@pytest.fixture(scope="module")
def dynamic_run(tiny_model_dir: Path, prompts: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(rl_config(tiny_model_dir, tmp_path_factory.mktemp("dynamic"), *DYNAMIC), prompts)


def records(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: r[k] for k in RECORD} for r in read_metrics(run_dir) if "train/loss" in r}


def test_dynamic_sampling_records_what_it_drew_dropped_and_sampled_extra(dynamic_run: Path) -> None:
    steps = records(dynamic_run)
    assert list(steps) == [1, 2, 3, 4]
    for step, r in steps.items():
        kept = r["rl/groups_drawn"] - r["rl/groups_dropped"]
        assert r["rl/groups_drawn"] >= 2 and r["rl/extra_rollouts"] == 4 * 2 * r["rl/refill_rounds"], (step, r)
        # A step that did not reach its 2 informative groups used all its rounds and says so.
        assert (kept < 2) == (r["rl/short_steps"] == 1) and (kept >= 2 or r["rl/refill_rounds"] == 2), (step, r)
        assert r["rl/prompts_all_solved"] + r["rl/prompts_none_solved"] <= r["rl/groups_drawn"]
        assert r["rl/groups_trained"] == min(kept, 2)  # only informative groups, up to the step's 2 prompts
    assert sum(r["rl/groups_dropped"] for r in steps.values()) > 0  # groups scored alike were dropped
    assert sum(r["rl/refill_rounds"] for r in steps.values()) > 0  # and steps refilled


def test_a_run_resumed_after_refills_equals_the_uninterrupted_run(
    dynamic_run: Path, tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    from rayft.runs import layout

    checkpoint = dynamic_run / layout.CHECKPOINTS_DIR / layout.step_dir_name(2)
    state = checkpoint / layout.TRAINER_SUBDIR / layout.rollouts_file(0)
    cursor = json.loads(state.read_text())["dynamic_sampling"]
    assert cursor["position"] > 0 or cursor["passes"] > 0  # the checkpoint holds the refill stream's place
    assert sum(r["rl/refill_rounds"] for s, r in records(dynamic_run).items() if s > 2) > 0  # refills after it
    crashed_copy(dynamic_run, tmp_path, crashed_at=3)
    resumed = train_on(rl_config(tiny_model_dir, tmp_path, *DYNAMIC), prompts, resume=True)
    assert train_losses(resumed) == pytest.approx(train_losses(dynamic_run), rel=1e-6, abs=1e-9)
    want = records(dynamic_run)
    for step, values in records(resumed).items():
        assert values == pytest.approx(want[step], rel=1e-6, abs=1e-9), step
