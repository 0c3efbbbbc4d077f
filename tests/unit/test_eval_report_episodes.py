"""compare.html (and the pipeline's report, which shows the same section) draws the episode figures compare.json
and compare.md carry: turns, tool calls per tool, tool errors, truncated episodes and the reward, per model."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.environments.builtin import calculator_tool
from rayft.environments.evaluate import EpisodeTally
from rayft.environments.runner import as_generation, run_episodes
from rayft.environments.tool_env import ToolsEnvironment
from rayft.evaluation.report import model_summary, pair_tests, render_html, render_markdown
from rayft.evaluation.runner import Example, Examples, ModelRun, score_run
from rayft.evaluation.summary import CompareSummary
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation, Prompt
from rayft.models.sources import ResolvedSource

QUESTIONS = [("6 * 7", 42), ("12 * 3", 36), ("nothing", 0)]


def call(expression: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"


def uses_the_tool(prompts: list[Prompt]) -> list[Generation]:
    """Calls the calculator on the question's product, then answers with the result (#### n)."""
    out = []
    for prompt in prompts:
        assert isinstance(prompt, list)
        last = prompt[-1]
        expression = str(last["content"]).removeprefix("Compute ")
        if last["role"] == "tool":
            out.append(Generation(f"#### {last['content']}"))
        else:
            out.append(Generation(call(expression) if "*" in expression else "#### 0"))
    return out


def always_calls(prompts: list[Prompt]) -> list[Generation]:
    """Calls a tool every turn (the tools taken away: each call an error), until the turns run out."""
    return [Generation(call("1 + 1")) for _ in prompts]


def episode_run(label: str, generate: Any, tools: bool) -> ModelRun:
    rows = [{"prompt": f"Compute {q}"} for q, _ in QUESTIONS]
    episodes = run_episodes(rows, lambda: ToolsEnvironment([calculator_tool()] if tools else []), generate,
                            max_turns=3)  # fmt: skip
    tally = EpisodeTally()
    tally.add(episodes)
    examples = Examples([Example(f"ds:{i}", f"Compute {q}", f"#### {a}", f"Compute {q}")
                         for i, (q, a) in enumerate(QUESTIONS)], [])  # fmt: skip
    source = ResolvedSource(label, "model", ModelConfig(name=f"org/{label}"))
    run = score_run(label, source, examples, [as_generation(e) for e in episodes], task=build_task(EvalConfig()),
                    ev=EvalConfig(bootstrap_samples=100), elapsed_s=1.0)  # fmt: skip
    return dataclasses.replace(run, episodes=tally.summary(with_tools=tools))


def summary() -> CompareSummary:
    runs = [episode_run("plain", always_calls, False), episode_run("tools", uses_the_tool, True)]
    return CompareSummary(task="gsm8k", num_examples=len(QUESTIONS), num_fewshot=0, confidence=0.95,
                          significance=0.05, primary_metric="accuracy_flexible",
                          models={r.label: model_summary(r) for r in runs},
                          pairs=pair_tests(runs, 0.95, 0.05, 100, 0))  # fmt: skip


def cells(page: str, label: str) -> list[str]:
    """The cells of the episodes table's row of ``label``."""
    section = page[page.index("<h2>Episodes</h2>") :]
    row = re.search(rf"<tr><td>{label}</td>(.*?)</tr>", section)
    assert row is not None, section[:2000]
    return [label, *re.findall(r"<td>(.*?)</td>", row.group(1))]


def test_compare_html_shows_each_models_episode_figures_beside_compare_md() -> None:
    result = summary()
    tools, plain = result.models["tools"].episodes, result.models["plain"].episodes
    assert tools["tool_calls_by_tool"] == {"calculator": 2} and plain["tool_errors_by_tool"] == {"<unknown>": 9}
    page = render_html(result, [])
    head = re.search(r"<h2>Episodes</h2>\s*<table>\s*<tr>(.*?)</tr>", page)
    assert head is not None
    assert re.findall(r"<th>(.*?)</th>", head.group(1)) == [
        "model", "tools", "episodes", "turns / episode", "tool calls / episode", "&lt;unknown&gt; calls",
        "calculator calls", "tool errors", "timeouts", "truncated", "failed", "reward",
    ]  # fmt: skip
    # Two of three problems call the calculator once and answer after its result; all three answers are right.
    assert cells(page, "tools") == ["tools", "with", "3", "1.6667", "0.6667", "0", "2", "0", "0", "0", "0",
                                    "1.000 (accuracy_flexible)"]  # fmt: skip
    # Without tools every call is an error, and every episode runs out of turns (3 of them).
    assert cells(page, "plain") == ["plain", "without", "3", "3", "3", "9", "0", "9 (&lt;unknown&gt; 9)", "0",
                                    "3 (turns 3)", "0", "0.000 (accuracy_flexible)"]  # fmt: skip
    chart = page[page.index("<h2>Episodes</h2>") :]
    assert "<svg" in chart and "tools turns: 1.667" in chart and "plain &lt;unknown&gt; calls: 3.000" in chart
    assert "<unknown>" not in page  # escaped everywhere
    markdown = render_markdown(result, [])
    assert "3 episodes without tools: 3 turns and 3 tool calls each (<unknown> 9); 9 tool errors" in markdown


def test_the_episode_chart_scale_reaches_counts_above_one() -> None:
    page = render_html(summary(), [])
    chart = page[page.index("<h2>Episodes</h2>") :]
    # The axis' top tick is the tallest bar (3 calls per episode), not 1: every bar stays inside the plot.
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([0-9.]+)</text>', chart.split("</svg>")[0])]
    assert max(ticks) == 3.0
    assert all(float(y) >= 0 for y in re.findall(r'<rect x="[0-9.]+" y="(-?[0-9.]+)"', chart.split("</svg>")[0]))


def test_the_pipeline_report_draws_the_same_episodes_section() -> None:
    from rayft.pipeline.report import _compare_section

    result = summary()
    assert "<h2>Episodes</h2>" in _compare_section(result)
    plain = dataclasses.replace(result, models={k: dataclasses.replace(m, episodes={}) for k, m in
                                                result.models.items()})  # fmt: skip
    assert "<h2>Episodes</h2>" not in _compare_section(plain) and "<h2>Episodes</h2>" not in render_html(plain, [])
