"""The reward functions of train.rl and their config: rayft's verifiers as rewards, weights, errors counted,
and the settings refused with a one-line reason."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.rl import RewardConfig
from rayft.errors import ConfigError
from rayft.evaluation.rewards import RewardSet, math_reward


def test_math_reward_reads_the_strict_answer_then_the_last_number() -> None:
    reference = "She has 3*4 = <<3*4=12>>12 left.\n#### 12"
    assert math_reward("3 boxes of 4 make 12.\n#### 12", reference) == 1.0
    assert math_reward("so the answer is 12", reference) == 1.0  # no '####': the last number
    assert math_reward("#### 13", reference) == 0.0
    assert math_reward("no number at all", reference) == 0.0
    assert math_reward("#### 1,200", "#### 1200") == 1.0


def test_weighted_rewards_are_summed_and_kept_apart() -> None:
    regex = RewardConfig(function="regex", pattern="#### ", weight=0.5, name="format")
    functions = [RewardConfig(function="math"), regex]
    rewards = RewardSet.build(functions, 64)
    scores = rewards.score(["#### 7", "7", "#### 8"], ["#### 7"] * 3)
    assert rewards.names == ["math", "format"]
    assert scores.by_function == {"math": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert scores.total == [1.5, 1.0, 0.5]
    assert scores.errors == {"math": 0, "format": 0}


def test_a_user_function_that_raises_or_returns_no_number_scores_0_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        def picky(completion, reference):
            if completion == "boom":
                raise KeyError("boom")
            return None if completion == "none" else 1.0
    '''))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = RewardSet.build([RewardConfig(function="my_rewards:picky")], 64)
    scores = rewards.score(["ok", "boom", "none", "boom"], ["r"] * 4)
    assert scores.by_function["picky"] == [1.0, 0.0, 0.0, 0.0]
    assert scores.errors == {"picky": 3}
    warnings = [r.getMessage() for r in caplog.records if "picky" in r.getMessage()]
    assert len(warnings) == 1 and "raised KeyError" in warnings[0]  # logged once per function
    sys.modules.pop("my_rewards", None)


def test_a_user_function_that_cannot_be_imported_fails_at_start_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^train\.rl\.rewards: cannot import module 'no_such_module_x'"):
        RewardSet.build([RewardConfig(function="no_such_module_x:fn")], 64)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.rl.rewards=[{function: regex}]"], "reward function 'regex' needs a pattern"),
        (["train.rl.rewards=[{function: exactmatch}]"], "neither built in"),
        (["data.packing=true"], "each row's prompt is sampled from on its own"),
        (["train.rl.group_size=1"], "group_size"),
        (["train.method=full", "train.rl.kl_coef=0.1", "train.rl.reference=base"], "switches a LoRA adapter off"),
    ],
)
def test_rl_settings_that_cannot_work_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["train.objective=grpo", "data.packing=false", *overrides])


def test_grpo_loads_under_every_strategy() -> None:
    for strategy in ("ddp", "fsdp", "deepspeed"):  # the sharded ones gather the whole weights to sample from
        cfg = load_config(None, ["train.objective=grpo", "data.packing=false", f"train.strategy={strategy}"])
        assert cfg.train.strategy == strategy


def test_grpo_defaults() -> None:
    cfg = load_config(None, ["train.objective=grpo", "data.packing=false"])
    rl = cfg.train.rl
    assert (rl.loss, rl.advantage, rl.scale_rewards, rl.kl_coef, rl.clip_high) == ("dapo", "group", "group", 0.0, 0.2)
    assert [r.function for r in rl.rewards] == ["math"]
    assert not cfg.train.preference_objective
