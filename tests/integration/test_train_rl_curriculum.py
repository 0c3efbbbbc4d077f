"""The curriculum end to end on a tiny random model over the built-in arithmetic prompts: the prompts a step's
completions all solved or none solved become symbolic variants, queued and served in later steps (their
figures add up step by step), the checkpoint holds the queue beside dynamic sampling's cursor, and a run
resumed from it equals the uninterrupted run.

A random model never solves arithmetic, so "solved" is the first reward, whether a completion starts with a
digit: some groups all do, most none do, a few are mixed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.data.prepared import PreparedData
from rayft.sdg.mathcheck import check_math_answer
from tests.integration.test_train_rl import rl_config
from tests.support.runs import crashed_copy, read_metrics, train_losses, train_on

pytestmark = pytest.mark.integration

CURRICULUM = ("scaling.num_workers=0", "train.max_steps=4", "train.save_steps=2", "train.learning_rate=5e-2",
              "train.rl.rewards=[{function: regex, pattern: '^\\s*[0-9]'}]",
              "train.rl.curriculum={max_per_step: 2, serve_per_step: 1, queue_size: 3}",
              "train.rl.dynamic_sampling={max_rounds: 1}")  # fmt: skip
NAMES = ("harder_added", "easier_added", "served", "queue", "not_rewritable", "no_draw", "leaked", "dropped")
RECORD = (*(f"rl/curriculum/{n}" for n in NAMES), "rl/prompts_all_solved", "rl/prompts_none_solved", "rl/reward")


@pytest.fixture(scope="module")
def prompts(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(rl_config(tiny_model_dir, tmp_path_factory.mktemp("prep")), None, use_ray=True)


@pytest.fixture(scope="module")
def curriculum_run(tiny_model_dir: Path, prompts: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(rl_config(tiny_model_dir, tmp_path_factory.mktemp("curriculum"), *CURRICULUM), prompts)


def records(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: r[k] for k in RECORD} for r in read_metrics(run_dir) if "train/loss" in r}


def test_solved_and_unsolved_prompts_become_variants_served_in_later_steps(curriculum_run: Path) -> None:
    steps = records(curriculum_run)
    assert list(steps) == [1, 2, 3, 4]
    queue = 0.0
    for step, r in steps.items():
        c = {n: r[f"rl/curriculum/{n}"] for n in NAMES}
        # Served before the step samples (what earlier steps queued), then this step's prompts are varied.
        assert c["served"] == min(1.0, queue), (step, c)
        added = c["harder_added"] + c["easier_added"]
        tried = added + c["not_rewritable"] + c["no_draw"] + c["leaked"]
        wanted = r["rl/prompts_all_solved"] + r["rl/prompts_none_solved"]
        # The step's own 2 prompts are varied (wanted also counts the groups dynamic sampling drew).
        assert tried <= min(2.0, wanted), (step, r)
        assert c["not_rewritable"] == 0 and c["leaked"] == 0
        queue = queue - c["served"] + added - c["dropped"]
        assert c["queue"] == queue <= 3, (step, c)
    assert steps[1]["rl/curriculum/served"] == 0 and sum(r["rl/curriculum/served"] for r in steps.values()) >= 2


def test_a_run_resumed_with_a_queue_equals_the_uninterrupted_run(
    curriculum_run: Path, tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    from rayft.runs import layout

    checkpoint = curriculum_run / layout.CHECKPOINTS_DIR / layout.step_dir_name(2)
    state = json.loads((checkpoint / layout.TRAINER_SUBDIR / layout.rollouts_file(0)).read_text())
    queued = state["curriculum"]["queue"]
    assert queued and "dynamic_sampling" in json.loads(state["inner"])  # both kept, one inside the other
    assert all(check_math_answer(v["reference"]) is None for v in queued)  # verified, re-computed solutions
    assert records(curriculum_run)[3]["rl/curriculum/served"] == 1  # the resumed step serves from it
    crashed_copy(curriculum_run, tmp_path, crashed_at=3)
    resumed = train_on(rl_config(tiny_model_dir, tmp_path, *CURRICULUM), prompts, resume=True)
    assert train_losses(resumed) == pytest.approx(train_losses(curriculum_run), rel=1e-6, abs=1e-9)
    want = records(curriculum_run)
    for step, values in records(resumed).items():
        assert values == pytest.approx(want[step], rel=1e-6, abs=1e-9), step
