"""Which environment the eval stage of ``rayft run`` runs its examples in: pure decisions, no I/O.

A model trained with multi-turn RL in an environment is measured in that environment: when the config
writes no ``eval.environment``, the eval stage takes the ``rl`` stage's ``rl.environment`` or, without an
``rl`` stage, the train stage's own ``train.rl.environment`` (``objective: grpo``). A written
``eval.environment`` wins, ``null`` included: ``eval: {environment: null}`` evaluates single-turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from rayft.config import RayftConfig
from rayft.config.checks import requested_stages
from rayft.config.environment import EnvironmentConfig
from rayft.config.evaluation import EvalConfig
from rayft.errors import ConfigError


@dataclass(frozen=True)
class EvalEnvironment:
    """The eval stage's environment (None: single-turn) and the config path it comes from (None: nowhere)."""

    environment: EnvironmentConfig | None
    source: str | None


def eval_environment(cfg: RayftConfig) -> EvalEnvironment:
    """The environment the eval stage runs in: ``eval.environment`` when the config writes it, else the one the
    pipeline trains in (``rl.environment``, then ``train.rl.environment`` when the train stage's objective samples
    completions)."""
    if "environment" in cfg.eval.model_fields_set:
        return EvalEnvironment(cfg.eval.environment, "eval.environment" if cfg.eval.environment else None)
    stages = requested_stages(cfg.model_fields_set)
    if "rl" in stages and cfg.rl.environment is not None:
        return EvalEnvironment(cfg.rl.environment, "rl.environment")
    if "train" in stages and cfg.train.traits.samples and cfg.train.rl.environment is not None:
        return EvalEnvironment(cfg.train.rl.environment, "train.rl.environment")
    return EvalEnvironment(None, None)


def eval_stage_config(cfg: RayftConfig) -> RayftConfig:
    """``cfg`` with the eval section the eval stage runs: its environment from :func:`eval_environment`.

    Raises:
        ConfigError: the eval section cannot run the inherited environment (``eval.backend: vllm``).
    """
    chosen = eval_environment(cfg)
    if chosen.environment is None or chosen.source == "eval.environment":
        return cfg
    section = cfg.eval.model_copy(update={"environment": chosen.environment})
    try:  # the section's own checks, which a copy skips
        EvalConfig.model_validate(section.model_dump(mode="json"))
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(
            f"eval: the eval stage runs {chosen.source} (the environment the model trained in) as eval.environment, "
            f"which the eval section refuses ({reason}); set eval.environment: null to evaluate single-turn"
        ) from None
    return cfg.model_copy(update={"eval": section})
