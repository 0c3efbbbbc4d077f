"""The eval stage of ``rayft run`` measures a model in the environment it trained in: the rl stage's (or the
grpo train stage's) environment when the eval section writes none; a written one, null included, wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import ConfigError
from rayft.pipeline.eval_plan import eval_environment, eval_stage_config

AGENT = Path(__file__).parents[2] / "configs" / "agent.yaml"
CALCULATOR = {"type": "tools", "tools": ["calculator"], "max_turns": 3, "tool_timeout_s": 2}


def config(**sections: Any) -> RayftConfig:
    return RayftConfig.model_validate(sections)


def test_the_shipped_agent_config_evaluates_in_its_rl_environment() -> None:
    cfg = load_config(AGENT)
    assert cfg.eval.environment is None and cfg.rl.environment is not None
    chosen = eval_environment(cfg)
    assert chosen.source == "rl.environment" and chosen.environment == cfg.rl.environment
    staged = eval_stage_config(cfg)
    assert staged.eval.environment == cfg.rl.environment and staged.eval.task == cfg.eval.task
    assert staged.rl == cfg.rl and cfg.eval.environment is None  # the loaded config is left as it was


def test_an_explicit_eval_environment_wins_and_null_evaluates_single_turn() -> None:
    own = {**CALCULATOR, "max_turns": 5}
    cfg = config(train={}, rl={"environment": CALCULATOR}, eval={"environment": own})
    assert eval_environment(cfg).source == "eval.environment"
    assert eval_stage_config(cfg).eval.environment is not None
    assert eval_stage_config(cfg).eval.environment == cfg.eval.environment
    assert eval_stage_config(cfg).eval.environment.max_turns == 5  # type: ignore[union-attr]
    single = config(train={}, rl={"environment": CALCULATOR}, eval={"environment": None})
    assert eval_environment(single).environment is None and eval_stage_config(single).eval.environment is None


def test_without_an_rl_stage_a_grpo_train_stage_lends_its_environment() -> None:
    grpo = {"objective": "grpo", "rl": {"environment": CALCULATOR}}
    cfg = config(train=grpo, data={"packing": False}, eval={})
    chosen = eval_environment(cfg)
    assert chosen.source == "train.rl.environment" and chosen.environment == cfg.train.rl.environment
    # An SFT train stage's rl settings are not what it trained with; an rl stage without one lends nothing.
    assert eval_environment(config(train={"rl": {"environment": CALCULATOR}}, eval={})).environment is None
    assert eval_environment(config(train={}, rl={}, eval={})) == eval_environment(config(eval={}))
    assert eval_environment(config(eval={})).source is None


def test_an_eval_section_that_cannot_run_the_inherited_environment_says_so_in_one_line() -> None:
    cfg = config(train={}, rl={"environment": CALCULATOR}, eval={"backend": "vllm"})
    message = (r"^eval: the eval stage runs rl.environment .*\(eval.environment runs with eval.backend 'hf' or "
               r"'openai'.*\); set eval.environment: null to evaluate single-turn$")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        eval_stage_config(cfg)
