"""Evaluation in an environment (``eval.environment``): each example is an episode, its final answer scored.

:func:`stream_eval` is what ``rayft eval`` and ``rayft compare`` run for one model: without
``eval.environment``, :func:`rayft.evaluation.streaming.stream_model` (one completion per example); with
it, the examples a window at a time, each an episode of the environment (:mod:`rayft.environments.runner`)
driven by the same generation pool, its final answer scored by ``eval.task`` exactly as a completion is,
and its rows appended to the same scratch file. So the outputs, the per-example rows and ``rayft
compare``'s paired tests are the same as for any eval; each row adds its ``episode`` (turns, tool calls,
errors, the conversation), and the summary the episodes' figures (:class:`EpisodeTally`). A model whose
label is in ``eval.without_tools`` runs the same episodes with the tools taken away.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.config.environment import EnvironmentConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.inference import GENERATION_WINDOW
from rayft.console import Progress
from rayft.environments.episode import Environment
from rayft.environments.loader import build_environment
from rayft.environments.runner import Episode, as_generation, run_episodes
from rayft.errors import ConfigError
from rayft.evaluation.report import example_record
from rayft.evaluation.runner import Example, ExampleStream, ModelRun, ScoreTally, generation_config, model_fingerprint
from rayft.evaluation.streaming import stream_model
from rayft.evaluation.tasks import Task
from rayft.generation.backend import Generation, Prompt
from rayft.generation.pool import GenerationPool, Runtime, in_input_order, open_pool
from rayft.models.sources import ResolvedSource
from rayft.security import redact

log = logging.getLogger("rayft.eval")
FIELD = "eval.environment"
REWARD_METRIC = "reward"
"""The metric of a user environment's episode reward (the tools environment's final answers are scored by
the task alone)."""


def stream_eval(
    label: str, source: ResolvedSource, examples: ExampleStream, rows_path: Path, *, task: Task, cfg: RayftConfig,
    runtime: Runtime,
) -> ModelRun:  # fmt: skip
    """One model's eval: completions, or episodes when ``eval.environment`` is set (same rows, same tally)."""
    env_cfg = cfg.eval.environment
    if env_cfg is None:
        return stream_model(label, source, examples, rows_path, task=task, cfg=cfg, runtime=runtime)
    tools = label not in cfg.eval.without_tools
    log.info("eval: %s (%s) on %d examples as episodes of %s %s, %s runtime", label, source.describe(),
             examples.count, env_cfg.type, f"with {env_cfg.tools}" if tools else "without tools", runtime)  # fmt: skip
    gen_cfg = generation_config(cfg.eval, source, task)
    tally, episodes = ScoreTally(task), EpisodeTally()
    started = time.monotonic()
    with (
        rows_path.open("w", encoding="utf-8") as out,
        Progress(f"eval {label}", examples.count, unit="episodes") as progress,
        open_pool(gen_cfg, runtime) as pool,
    ):
        generate = _pool_generate(pool, gen_cfg.batch_size)
        for window in _windows(examples):
            ran = run_episodes([episode_row(e, env_cfg) for e in window], lambda: make_environment(env_cfg, tools),
                               generate, max_turns=env_cfg.max_turns, on_finished=progress.advance)  # fmt: skip
            generations = [as_generation(e) for e in ran]
            extra = [{REWARD_METRIC: e.reward} for e in ran] if env_cfg.type != "tools" else None
            for item in zip(window, generations, tally.add(window, generations, extra), strict=True):
                out.write(redact(json.dumps(example_record(*item), ensure_ascii=False)) + "\n")
            episodes.add(ran)
    run = tally.finish(label, source, cfg.eval, time.monotonic() - started)
    return dataclasses.replace(run, fingerprint=model_fingerprint(source, gen_cfg), rows_path=rows_path,
                               episodes=episodes.summary(with_tools=tools))  # fmt: skip


def check_without_tools(ev: EvalConfig, labels: Sequence[str]) -> None:
    """Refuse, before any model loads, an ``eval.without_tools`` label that names no evaluated model."""
    unknown = [label for label in ev.without_tools if label not in labels]
    if unknown:
        raise ConfigError(f"eval.without_tools names {unknown}, not models evaluated here ({', '.join(labels)}); "
                          "use the labels of --model LABEL=SRC (rayft eval's model is 'model')")  # fmt: skip


def make_environment(cfg: EnvironmentConfig, tools: bool = True) -> Environment:
    """A fresh environment of ``cfg`` for one episode; without ``tools``, the tools environment with none."""
    return build_environment(cfg if tools else cfg.model_copy(update={"tools": []}), field=FIELD)


def episode_row(example: Example, cfg: EnvironmentConfig) -> dict[str, Any]:
    """The row an episode starts from: the example's prompt (its messages, or its text), its question and
    reference, and its table under the environment's table column (for the SQL tool)."""
    prompt = example.prompt
    row: dict[str, Any] = {"id": example.id, "question": example.question, "answer": example.reference}
    row.update({"messages": list(prompt)} if isinstance(prompt, list) else {"prompt": prompt})
    if example.table is not None:
        row[cfg.table_column] = example.table
    return row


def _windows(examples: ExampleStream) -> Iterator[list[Example]]:
    source = iter(examples)
    while window := list(itertools.islice(source, GENERATION_WINDOW)):
        yield window


def _pool_generate(pool: GenerationPool, batch_size: int) -> Callable[[list[Prompt]], list[Generation]]:
    """One turn of many episodes through the pool (longest prompts batched together), in prompt order."""

    def generate(prompts: list[Prompt]) -> list[Generation]:
        windows = in_input_order(prompts, lambda p: p, pool, batch_size=batch_size)
        return [generation for window in windows for _, generation in window]

    return generate


@dataclasses.dataclass
class EpisodeTally:
    """The episodes' figures over an eval: counts and means for the summary, calls and errors per tool."""

    episodes: int = 0
    turns: int = 0
    tool_calls: Counter[str] = dataclasses.field(default_factory=Counter)
    tool_errors: Counter[str] = dataclasses.field(default_factory=Counter)
    tool_timeouts: Counter[str] = dataclasses.field(default_factory=Counter)
    truncated: Counter[str] = dataclasses.field(default_factory=Counter)
    failed: int = 0

    def add(self, episodes: Sequence[Episode]) -> None:
        """Count a window of finished episodes."""
        for episode in episodes:
            self.episodes += 1
            self.turns += len(episode.turns)
            self.tool_calls.update(episode.info.get("tool_calls_by_tool", {}))
            self.tool_errors.update(episode.info.get("tool_errors", {}))
            self.tool_timeouts.update(episode.info.get("tool_timeouts", {}))
            if episode.info.get("truncated"):
                self.truncated[str(episode.info["truncated"])] += 1
            self.failed += episode.error is not None

    def summary(self, *, with_tools: bool) -> dict[str, Any]:
        """The figures as eval.json's ``episodes``."""
        count = max(self.episodes, 1)
        return {
            "episodes": self.episodes, "with_tools": with_tools, "mean_turns": round(self.turns / count, 4),
            "tool_calls": sum(self.tool_calls.values()),
            "mean_tool_calls": round(sum(self.tool_calls.values()) / count, 4),
            "tool_calls_by_tool": dict(self.tool_calls), "tool_errors": sum(self.tool_errors.values()),
            "tool_errors_by_tool": dict(self.tool_errors), "tool_timeouts": sum(self.tool_timeouts.values()),
            "truncated": sum(self.truncated.values()), "truncated_by_limit": dict(self.truncated),
            "failed": self.failed,
        }  # fmt: skip
