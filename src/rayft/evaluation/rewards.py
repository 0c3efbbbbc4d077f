"""Rewards for reinforcement learning: rayft's verifiers as functions of (completion, reference) -> float.

A reward is what a verifier says of one sampled completion: the math answer checked with the GSM8K
extraction the evaluation uses, an exact match, a format (regular expression), brevity, SQL execution
accuracy on the row's own table, the share of the row's tests a completion's code passes in the process
sandbox, a judge model's score of the completion against a rubric (:mod:`rayft.evaluation.judge`), a reward
model's score of the prompt and the completion (:mod:`rayft.evaluation.reward_model`), or a user's
``package.module:function``. A function that reads more of
its row than the reference (the 'sql' reward, or a user's function with a parameter named ``row``) is
called with ``row=``: the dict of the columns ``train.rl`` carries with each prompt.

:class:`RewardSet` scores a batch of completions with every configured function and keeps each
function's rewards apart, so that each is logged on its own; a function that raises or returns a
non-number scores that sample 0 (a failed judgement: the judge's fallback) and is counted, so one bad
sample never ends a run.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayft.config.rl import RewardConfig
from rayft.errors import ConfigError
from rayft.evaluation import code, gsm8k, sql
from rayft.evaluation.judge import JudgeError, LLMJudge
from rayft.evaluation.metrics import exact_match, load_custom_metric

log = logging.getLogger(__name__)

RewardFn = Callable[..., float]
"""``fn(completion, reference) -> float``, or, for a function with a parameter ``row``,
``fn(completion, reference, row=row)``."""
Row = Mapping[str, Any]
"""The columns carried with a prompt (``train.rl.carried_columns``), by name."""


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


class BatchReward:
    """A reward that also scores a whole batch at once (:meth:`many`), where one call per completion would
    cost a process start each (the sql reward: one sandboxed process per batch instead of per query).
    Called with one completion, it is a plain reward function."""

    def __init__(self, one: RewardFn, many: Callable[[Sequence[str], Sequence[str], Sequence[Row]], list[Any]]):
        self.one = one
        self.many = many
        """``many(completions, references, rows)``: per completion, its reward or the exception it raised."""

    def __call__(self, completion: str, reference: str, row: Row) -> float:
        return float(self.one(completion, reference, row=row))


def sql_reward(column: str) -> BatchReward:
    """Execution accuracy on the row's table in ``column``: 1.0 when the completion, run as a query in
    :mod:`rayft.evaluation.sql`'s read-only sandbox, gives the reference query's result; 0.0 for another
    result or a query that does not run (a syntax error, a refused write, a timeout). The completion is
    the query as it stands, as eval's sql task scores an output. A table that does not parse or a
    reference that does not run on it raises: the sample is counted as a reward error."""
    where = f"the row's {column!r} column"

    def table_text(row: Row) -> str:
        table = row[column]
        return table if isinstance(table, str) else json.dumps(table, default=str)

    def reward(completion: str, reference: str, row: Row) -> float:
        correct, _ = sql.score_execution(completion, reference, table_text(row), where)
        return float(correct)

    def many(completions: Sequence[str], references: Sequence[str], rows: Sequence[Row]) -> list[Any]:
        results: list[Any] = [KeyError(column) if column not in row else None for row in rows]
        todo = [i for i, r in enumerate(results) if r is None]
        scored = sql.score_many([(completions[i], references[i], table_text(rows[i]), where) for i in todo])
        for i, result in zip(todo, scored, strict=True):
            results[i] = result if isinstance(result, Exception) else float(result[0])
        return results

    return BatchReward(reward, many)


def code_reward(column: str, scoring: str = "fraction") -> RewardFn:
    """Code execution on the row's tests in ``column``: the completion's code (its last ```python block) run
    in :mod:`rayft.sandbox` with each test; the share that pass, or, with ``scoring='all'``, 1.0 only when
    all pass. Code that fails, hangs or passes a limit scores 0; tests that are not a list of statements
    raise: the sample is counted as a reward error."""

    def reward(completion: str, reference: str, row: Row) -> float:
        tests = code.parse_tests(row[column], f"the row's {column!r} column")
        run = code.run_tests(code.extract_code(completion), tests)
        return float(run.passed == run.total > 0) if scoring == "all" else run.fraction

    return reward


def judge_reward(cfg: RewardConfig) -> BatchReward:
    """An LLM judge's score (:mod:`rayft.evaluation.judge`), a batch's judgements sent concurrently."""
    assert cfg.judge is not None  # the config requires a judge section for function 'judge'
    judge = LLMJudge(cfg.judge)
    return BatchReward(judge, judge.many)


def reward_model_reward(cfg: RewardConfig) -> BatchReward:
    """A reward model's score of the row's prompt and the completion (:mod:`rayft.evaluation.reward_model`),
    a batch scored in forward passes of ``batch_size`` on this process's CPU."""
    from rayft.evaluation.reward_model import RewardModelScorer  # imports torch and transformers

    assert cfg.reward_model is not None  # the config requires a reward_model section for function 'reward_model'
    scorer = RewardModelScorer(cfg.reward_model)
    return BatchReward(scorer, scorer.many)


def takes_row(fn: RewardFn) -> bool:
    """Whether ``fn`` reads its row: it has a parameter named ``row``."""
    try:
        return "row" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function without a signature: called as (completion, reference)
        return False


def build_reward(cfg: RewardConfig, max_new_tokens: int) -> RewardFn:
    """The function ``cfg`` names: a built-in from the table below, else a user's ``package.module:function``."""
    builders: dict[str, Callable[[], RewardFn]] = {
        "sql": lambda: sql_reward(cfg.columns[0]),
        "code": lambda: code_reward(cfg.columns[0], cfg.code_scoring),
        "judge": lambda: judge_reward(cfg),
        "reward_model": lambda: reward_model_reward(cfg),
        "math": lambda: math_reward,
        "exact_match": lambda: exact_match,
        "regex": lambda: regex_reward(cfg.pattern or ""),  # the config requires a pattern for regex
        "length": lambda: (
            lambda completion, reference: 1.0 - min(len(completion), max_new_tokens * 4) / (max_new_tokens * 4)
        ),
    }
    if cfg.function in builders:
        return builders[cfg.function]()
    return load_custom_metric(cfg.function, field="train.rl.rewards")


@dataclass
class Scores:
    """The rewards of a batch of completions: the weighted total and each function's own."""

    total: list[float]
    by_function: dict[str, list[float]]
    errors: dict[str, int]


@dataclass(frozen=True)
class Reward:
    """One configured reward function: its name, its weight, and whether it is called with the row."""

    name: str
    weight: float
    fn: RewardFn
    reads_row: bool = False


@dataclass
class RewardSet:
    """The configured reward functions, each with its weight and name."""

    functions: list[Reward]
    errors_logged: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, rewards: Sequence[RewardConfig], max_new_tokens: int, row_columns: Sequence[str] = ()) -> RewardSet:
        """Load every function once (a user's module is imported here, so an import error shows at start).
        ``row_columns``: ``train.rl.row_columns``, which a user's function that takes ``row`` needs."""
        functions = []
        for cfg in rewards:
            fn = build_reward(cfg, max_new_tokens)
            reads_row = bool(cfg.columns) or takes_row(fn)
            if reads_row and not cfg.columns and not row_columns:
                raise ConfigError(
                    f"train.rl.rewards: function {cfg.function!r} takes a row, but train.rl.row_columns is empty; "
                    "list the columns it reads, e.g. train.rl.row_columns=[table]"
                )
            functions.append(Reward(cfg.label, cfg.weight, fn, reads_row))
        return cls(functions)

    @property
    def names(self) -> list[str]:
        """The functions' names, in configuration order."""
        return [reward.name for reward in self.functions]

    @property
    def reads_rows(self) -> bool:
        """Whether some function is called with its row."""
        return any(reward.reads_row for reward in self.functions)

    def score(self, completions: Sequence[str], references: Sequence[str], rows: Sequence[Row] | None = None) -> Scores:
        """Every function's reward of every completion, and their weighted sums; ``rows``: each completion's
        row, for the functions that read it (empty rows when not given)."""
        rows = rows if rows is not None else [{}] * len(completions)
        by_function: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        for reward in self.functions:
            if isinstance(reward.fn, BatchReward):
                attempts = reward.fn.many(completions, references, rows)
            else:
                attempts = [self._attempt(reward, c, r, row) for c, r, row in zip(completions, references, rows,
                                                                                  strict=True)]  # fmt: skip
            checked = [self._checked(reward.name, attempt) for attempt in attempts]
            errors[reward.name] = sum(value is None for value in checked)
            by_function[reward.name] = [_fallback(attempt) if value is None else value
                                        for attempt, value in zip(attempts, checked, strict=True)]  # fmt: skip
        total = [sum(r.weight * by_function[r.name][i] for r in self.functions) for i in range(len(completions))]
        return Scores(total, by_function, errors)

    def _attempt(self, reward: Reward, completion: str, reference: str, row: Row) -> Any:
        """The function's value, or the exception it raised."""
        try:
            return reward.fn(completion, reference, row=row) if reward.reads_row else reward.fn(completion, reference)
        except Exception as exc:  # a user's function: any failure is that sample's, counted, not the run's
            return exc

    def _checked(self, name: str, value: Any) -> float | None:
        """The reward, or None (logged once per function) when the function raised or gave no finite number."""
        if isinstance(value, bool | int | float) and math.isfinite(float(value)):
            return float(value)
        if isinstance(value, Exception):
            problem = f"raised {type(value).__name__}: {value}"
        else:
            problem = f"returned {type(value).__name__} {value!r:.40}, not a finite number"
        if name not in self.errors_logged:
            self.errors_logged.add(name)
            log.warning(
                "reward function %s %s; such samples score 0 (a judge's: its fallback) and are counted in "
                "rl/reward_errors/%s (logged once)",
                name, problem, name,
            )  # fmt: skip
        return None


def _fallback(attempt: Any) -> float:
    """The reward of a sample its function failed on: the judge's configured fallback, else 0."""
    return attempt.fallback if isinstance(attempt, JudgeError) else 0.0
