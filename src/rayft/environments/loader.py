"""An environment from its config section: the built-in tools environment, or a user's class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayft.config.environment import EnvironmentConfig
from rayft.environments.builtin import calculator_tool, python_tool, sql_tool
from rayft.environments.episode import Environment, EpisodeLimits, TokenCounter, approximate_tokens
from rayft.environments.tool_env import RewardOfAnswer, ToolsEnvironment
from rayft.environments.tools import Tool
from rayft.errors import ConfigError
from rayft.evaluation.metrics import load_custom_metric
from rayft.sandbox import Limits

FIELD = "train.rl.environment"


def build_environment(
    cfg: EnvironmentConfig, *, reward: RewardOfAnswer | None = None, count_tokens: TokenCounter = approximate_tokens,
    field: str = FIELD,
) -> Environment:  # fmt: skip
    """A fresh environment for one episode at a time: ``reward`` scores the final answer (the tools
    environment), ``count_tokens`` counts an episode's tokens (the policy's tokenizer, where there is one)."""
    if cfg.type != "tools":
        return load_environment(cfg.type, cfg.options, field)
    limits = EpisodeLimits(cfg.max_turns, cfg.max_tool_calls, cfg.max_tokens, cfg.tool_timeout_s)
    return ToolsEnvironment(build_tools(cfg), reward=reward, limits=limits, count_tokens=count_tokens)


def build_tools(cfg: EnvironmentConfig) -> list[Tool]:
    """The built-in tools ``cfg.tools`` names; the Python tool's sandbox ends at the call's timeout."""
    python_limits = Limits(wall_s=cfg.tool_timeout_s, cpu_s=cfg.tool_timeout_s, memory_mb=cfg.python_memory_mb,
                           processes=16, output_bytes=16384)  # fmt: skip
    builders: dict[str, Callable[[], Tool]] = {
        "calculator": calculator_tool,
        "sql": lambda: sql_tool(cfg.table_column),
        "python": lambda: python_tool(python_limits),
    }
    return [builders[name]() for name in cfg.tools]


def load_environment(path: str, options: dict[str, object], field: str = FIELD) -> Environment:
    """A user's environment, ``package.module:Class(**options)``, imported the way user rewards are."""
    cls: Any = load_custom_metric(path, field=f"{field}.type")  # a class is callable: the same loader as rewards
    try:
        environment = cls(**options)
    except Exception as exc:  # the class's own validation of its options
        raise ConfigError(
            f"{field}.type={path!r}: constructing it with {field}.options failed ({type(exc).__name__}: {exc}); "
            "fix the options"
        ) from exc
    missing = [name for name in ("reset", "step") if not callable(getattr(environment, name, None))]
    if missing:
        raise ConfigError(
            f"{field}.type={path!r}: the object lacks {' and '.join(missing)} of rayft.environments.Environment; "
            "define reset(row) -> messages and step(model_turn) -> StepResult"
        )
    return environment  # type: ignore[no-any-return]
