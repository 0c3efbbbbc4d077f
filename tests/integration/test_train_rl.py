"""GRPO end to end on a tiny random model, prompts from rayft's built-in arithmetic set prepared on Ray
Data: the reward rises over a short run, 2 Ray Train workers (DDP) equal 1 worker, a resume from a
checkpoint is exact, and a reward function that raises is counted without ending the run.

A random model never solves arithmetic, so the runs reward what it can learn in a few steps: digits in
the completion (partial credit, so every group has a spread)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.support.runs import crashed_copy, interleaved, read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

PROMPTS = ("data.datasets=[{path: 'builtin:arithmetic', format: template, max_rows: 48, "
           "input_template: 'Question: {question}\\nAnswer:', output_template: '{answer}'}]")  # fmt: skip
GRPO = ("train.objective=grpo", "data.packing=false", "data.validation_fraction=0", "data.shuffle_buffer_size=1",
        "data.max_seq_length=256", "lora.dropout=0", "train.micro_batch_size=2", "train.logging_steps=1",
        "train.eval_steps=null", "train.rl.group_size=4", "train.rl.max_new_tokens=8")  # fmt: skip
# Built-in rewards only where Ray workers score: they import nothing from the test's directory.
BUILTIN_REWARDS = "train.rl.rewards=[{function: regex, pattern: '[0-9]'}, {function: length, weight: 0.5}]"
FIGURES = ("rl/reward", "rl/reward_std", "rl/pass@1", "rl/pass@4", "rl/completion_length", "rl/entropy",
           "rl/reward/regex", "rl/reward/length", "rl/zero_std_groups")  # fmt: skip


def rl_config(tiny_model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    return tiny_config(tiny_model_dir, storage, PROMPTS, f"data.cache_dir={storage.parent / 'cache'}", *GRPO,
                       *overrides)  # fmt: skip


@pytest.fixture(scope="module")
def prompts(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(rl_config(tiny_model_dir, tmp_path_factory.mktemp("prep")), None, use_ray=True)


@pytest.fixture(scope="module")
def ddp_run(ray_session: None, tiny_model_dir: Path, prompts: PreparedData, tmp_path_factory: Any) -> Path:
    overrides = (BUILTIN_REWARDS, "train.max_steps=4", "train.save_steps=2", "train.learning_rate=5e-2")
    return train_on(rl_config(tiny_model_dir, tmp_path_factory.mktemp("ddp"), *overrides), prompts)


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's reward module on this process's path: digit share, and one that raises on some samples."""
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent('''
        def digit_share(completion, reference):
            return sum(c.isdigit() for c in completion) / max(len(completion), 1)

        def flaky(completion, reference):
            if len(completion) % 2:
                raise ValueError("odd length")
            return 1.0
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_rewards"


def figures(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: r[k] for k in FIGURES} for r in read_metrics(run_dir) if "train/loss" in r}


def test_grpo_raises_a_learnable_reward_over_a_short_run(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path, reward_module: str
) -> None:
    cfg = rl_config(tiny_model_dir, tmp_path, "scaling.num_workers=0", "train.method=full", "train.max_steps=24",
                    "train.learning_rate=1e-2", "train.save_steps=24", "train.micro_batch_size=4",
                    "train.rl.group_size=8", "train.rl.max_new_tokens=16",
                    f"train.rl.rewards=[{{function: '{reward_module}:digit_share'}}]")  # fmt: skip
    rewards = [values["rl/reward"] for values in figures_of(train_on(cfg, prompts), "rl/reward").values()]
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > 2 * first and last > first + 0.05, rewards


def figures_of(run_dir: Path, *names: str) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: r[k] for k in names} for r in read_metrics(run_dir) if "train/loss" in r}


def test_grpo_on_two_workers_equals_one_worker_whatever_the_forward_split(
    ddp_run: Path, tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    one = rl_config(tiny_model_dir, tmp_path, BUILTIN_REWARDS, "train.max_steps=4", "train.save_steps=2",
                    "train.learning_rate=5e-2", "scaling.num_workers=0", "train.gradient_accumulation_steps=2",
                    "train.rl.completions_per_forward=3")  # fmt: skip
    single = train_on(one, interleaved(prompts, tmp_path / "units", per_rank=2))
    want, got = train_losses(ddp_run), train_losses(single)
    assert list(want) == [1, 2, 3, 4] and want.keys() == got.keys()
    assert all(got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-6) for step in want), (got, want)
    for step, values in figures(single).items():
        assert values == pytest.approx(figures(ddp_run)[step], rel=1e-4, abs=1e-6), step
    assert any(values["rl/reward_std"] > 0 for values in figures(ddp_run).values())  # the groups teach something


def test_grpo_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    ddp_run: Path, tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path
) -> None:
    crashed_copy(ddp_run, tmp_path, crashed_at=3)
    cfg = rl_config(tiny_model_dir, tmp_path, BUILTIN_REWARDS, "train.max_steps=4", "train.save_steps=2",
                    "train.learning_rate=5e-2")  # fmt: skip
    resumed = train_on(cfg, prompts, resume=True)
    assert train_losses(resumed) == pytest.approx(train_losses(ddp_run), rel=1e-6, abs=1e-9)
    want = figures(ddp_run)
    assert figures(resumed).keys() == want.keys()
    for step, values in figures(resumed).items():
        assert values == pytest.approx(want[step], rel=1e-6, abs=1e-9), step


def test_a_reward_function_that_raises_is_counted_and_the_run_goes_on(
    tiny_model_dir: Path, prompts: PreparedData, tmp_path: Path, reward_module: str
) -> None:
    cfg = rl_config(tiny_model_dir, tmp_path, "scaling.num_workers=0", "train.max_steps=2", "train.save_steps=2",
                    f"train.rl.rewards=[{{function: '{reward_module}:flaky'}}, {{function: length}}]")  # fmt: skip
    run = train_on(cfg, prompts)
    records = [r for r in read_metrics(run) if "train/loss" in r]
    assert len(records) == 2 and (run / "final").is_dir()
    errors = sum(r["rl/reward_errors/flaky"] for r in records)
    assert 0 < errors < 2 * 2 * 4  # some of the 16 completions of 2 steps (2 prompts x 4 samples each) failed
    assert all(0 <= r["rl/reward/flaky"] <= 1 for r in records)
