"""Rewards for reinforcement learning: rayft's verifiers as functions of (completion, reference) -> float.

A reward is what a verifier says of one sampled completion: the math answer checked with the GSM8K
extraction the evaluation uses, an exact match, a format (regular expression), brevity, or a user's
``package.module:function``. :class:`RewardSet` scores a batch of completions with every configured
function and keeps each function's rewards apart, so that each is logged on its own; a function that
raises or returns a non-number scores that sample 0 and is counted, so one bad sample never ends a run.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rayft.config.rl import RewardConfig
from rayft.evaluation import gsm8k
from rayft.evaluation.metrics import exact_match, load_custom_metric

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str], float]


def math_reward(completion: str, reference: str) -> float:
    """1.0 when the completion's final answer equals the reference's: the strict ``#### N`` answer when the
    completion gives one, else its last number (the evaluation's flexible extraction)."""
    answer = gsm8k.extract_strict(completion)
    if answer == gsm8k.INVALID:
        answer = gsm8k.extract_flexible(completion)
    return float(gsm8k.is_correct(answer, gsm8k.reference_answer(reference)))


def regex_reward(pattern: str) -> RewardFn:
    """1.0 when the completion matches ``pattern`` (``re.search`` with DOTALL): a format reward."""
    compiled = re.compile(pattern, re.DOTALL)

    def reward(completion: str, reference: str) -> float:
        return float(compiled.search(completion) is not None)

    return reward


def build_reward(cfg: RewardConfig, max_new_tokens: int) -> RewardFn:
    """The function ``cfg`` names."""
    if cfg.function == "math":
        return math_reward
    if cfg.function == "exact_match":
        return exact_match
    if cfg.function == "regex":
        assert cfg.pattern is not None  # the config requires it
        return regex_reward(cfg.pattern)
    if cfg.function == "length":
        return lambda completion, reference: 1.0 - min(len(completion), max_new_tokens * 4) / (max_new_tokens * 4)
    return load_custom_metric(cfg.function, field="train.rl.rewards")


@dataclass
class Scores:
    """The rewards of a batch of completions: the weighted total and each function's own."""

    total: list[float]
    by_function: dict[str, list[float]]
    errors: dict[str, int]


@dataclass
class RewardSet:
    """The configured reward functions, each with its weight and name."""

    functions: list[tuple[str, float, RewardFn]]
    errors_logged: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, rewards: Sequence[RewardConfig], max_new_tokens: int) -> RewardSet:
        """Load every function once (a user's module is imported here, so an import error shows at start)."""
        return cls([(cfg.label, cfg.weight, build_reward(cfg, max_new_tokens)) for cfg in rewards])

    @property
    def names(self) -> list[str]:
        """The functions' names, in configuration order."""
        return [name for name, _, _ in self.functions]

    def score(self, completions: Sequence[str], references: Sequence[str]) -> Scores:
        """Every function's reward of every completion, and their weighted sums."""
        by_function: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        for name, _, fn in self.functions:
            values, errors[name] = [], 0
            for completion, reference in zip(completions, references, strict=True):
                value = self._call(name, fn, completion, reference)
                errors[name] += value is None
                values.append(0.0 if value is None else value)
            by_function[name] = values
        total = [
            sum(weight * by_function[name][i] for name, weight, _ in self.functions) for i in range(len(completions))
        ]
        return Scores(total, by_function, errors)

    def _call(self, name: str, fn: RewardFn, completion: str, reference: str) -> float | None:
        """``fn``'s reward, or None (logged once per function) when it raises or gives no finite number."""
        try:
            value = fn(completion, reference)
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                return float(value)
            problem = f"returned {type(value).__name__} {value!r:.40}, not a finite number"
        except Exception as exc:  # a user's function: any failure is that sample's, counted, not the run's
            problem = f"raised {type(exc).__name__}: {exc}"
        if name not in self.errors_logged:
            self.errors_logged.add(name)
            log.warning(
                "reward function %s %s; such samples score 0 and are counted in rl/reward_errors/%s (logged once)",
                name, problem, name,
            )  # fmt: skip
        return None
