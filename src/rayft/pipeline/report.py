"""report.html: one self-contained page (inline CSS and SVG, no scripts, no network) that tells what
a pipeline run did — stage timings, synthetic-data counts, training curves, base vs fine-tuned."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from rayft import charts
from rayft.evaluation.report import difference_interval, episodes_html, level_text
from rayft.evaluation.summary import CompareSummary
from rayft.pages import html_page

_COLORS = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed")
# report.html's own rules, after the shared page style (rayft.pages).
_CSS = """td.num{text-align:right;font-variant-numeric:tabular-nums}pre{margin:0;max-width:420px}
"""


@dataclass(frozen=True)
class StageRow:
    """One stage's line in the report: what was done with it and how long it took."""

    stage: str
    action: str
    reason: str
    elapsed_s: float


@dataclass(frozen=True)
class ReportInputs:
    """Everything the report shows; sections whose inputs are empty are left out."""

    name: str
    stages: Sequence[StageRow]
    sdg_summary: Mapping[str, Any] = field(default_factory=dict)
    train_metrics: Sequence[Mapping[str, Any]] = ()
    train_summary: Mapping[str, Any] = field(default_factory=dict)
    rl_metrics: Sequence[Mapping[str, Any]] = ()  # the rl stage's metrics.jsonl records
    rl_summary: Mapping[str, Any] = field(default_factory=dict)
    compare_summary: CompareSummary | None = None
    headline_note: str = ""
    examples: Sequence[Mapping[str, Any]] = ()
    export_summary: Mapping[str, Any] = field(default_factory=dict)
    software: Mapping[str, str] = field(default_factory=dict)
    profile_section: str = ""  # the training run's "where the time goes" (rayft.training.profiling.report)


def render_report(inputs: ReportInputs) -> str:
    """The report page as one HTML string."""
    parts = [
        f"<h1>rayft run <code>{escape(inputs.name)}</code></h1>",
        _headline(inputs.compare_summary, inputs.headline_note),
        _stages_section(inputs.stages),
    ]
    if inputs.sdg_summary:
        parts.append(_mapping_section("Synthetic data", inputs.sdg_summary))
    if inputs.train_metrics or inputs.train_summary:
        parts.append(_training_section(inputs.train_metrics, inputs.train_summary))
    if inputs.rl_metrics or inputs.rl_summary:
        parts.append(_rl_section(inputs.rl_metrics, inputs.rl_summary))
    if inputs.profile_section:
        parts.append(inputs.profile_section)
    if inputs.compare_summary:
        parts.append(_compare_section(inputs.compare_summary))
    if inputs.examples:
        parts.append(_examples_section(inputs.examples))
    if inputs.export_summary:
        parts.append(_mapping_section("Export", inputs.export_summary))
    if inputs.software:
        parts.append(_mapping_section("Software", inputs.software))
    return html_page(f"rayft run {inputs.name}", parts, _CSS)


def _headline(summary: CompareSummary | None, note: str = "") -> str:
    """One sentence at the top: the primary metric of each model and the first pair's verdict."""
    found = summary.headline_test() if summary is not None else None
    if summary is None or found is None:
        return ""
    pair, test = found
    values = []
    for label in (pair.a, pair.b):
        metric = summary.models[label].metrics.get(summary.primary_metric) if label in summary.models else None
        if metric is not None and _finite(metric.value):
            values.append(f"{escape(label)} {metric.value:.3f}")
    verdict = "<span class='ok'>significant</span>" if test.significant else "<span class='bad'>not significant</span>"
    caveat = f"<p class='muted'>Note: {escape(note)}.</p>" if note else ""
    return (
        f"<p style='font-size:1.1rem'><b>{escape(summary.primary_metric)}</b>: {' vs '.join(values)}; difference "
        f"{test.difference:+.3f}, {escape(test.test)} p = {test.p_value:.2g} ({verdict})</p>{caveat}"
    )


def _stages_section(stages: Sequence[StageRow]) -> str:
    rows = "".join(
        f"<tr><td>{escape(s.stage)}</td><td>{escape(s.action)}</td><td>{escape(s.reason)}</td>"
        f"<td class='num'>{s.elapsed_s:.1f}</td></tr>"
        for s in stages
    )
    total = sum(s.elapsed_s for s in stages)
    return (
        "<h2>Stages</h2><table><tr><th>stage</th><th>action</th><th>why</th><th>seconds (when run)</th></tr>"
        f"{rows}<tr><th colspan='3'>total</th><td class='num'>{total:.1f}</td></tr></table>"
    )


def _mapping_section(title: str, data: Mapping[str, Any]) -> str:
    return f"<h2>{escape(title)}</h2>{_mapping_table(data)}"


def _mapping_table(data: Mapping[str, Any]) -> str:
    rows = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            cell = _mapping_table(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
            cell = _records_table(value)
        else:
            cell = _format_value(value)
        rows.append(f"<tr><th>{escape(str(key))}</th><td>{cell}</td></tr>")
    return f"<table>{''.join(rows)}</table>"


def _records_table(records: Sequence[Mapping[str, Any]]) -> str:
    """A list of records (say, SDG stages with their row counts) as one table with a column per key."""
    columns = list(dict.fromkeys(key for record in records for key in record))
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_format_value(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in records
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return escape(f"{value:.4g}")
    if isinstance(value, list | tuple):
        return escape(", ".join(str(v) for v in value))
    return escape(str(value))


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) of every record holding a finite ``key``."""
    return [(float(r["step"]), float(r[key])) for r in metrics if key in r and _finite(r[key])]


def _training_section(metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    loss = {"train loss": _series(metrics, "train/loss"), "validation loss": _series(metrics, "eval/loss")}
    drawn = [
        _line_chart({k: v for k, v in loss.items() if v}, charts.Names("step", "Loss", "loss")),
        _line_chart(
            {"learning rate": _series(metrics, "train/learning_rate")}, charts.Names("step", "Learning rate", "lr")
        ),
    ]
    table = _mapping_table(summary) if summary else ""
    return f"<h2>Training</h2>{table}<div class='charts'>{''.join(c for c in drawn if c)}</div>"


def _rl_section(metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """The RL run: its reward, pass rate and validation reward by step, beside the stage's summary."""

    names = {"reward": "rl/reward", "pass@1": "rl/pass@1", "validation reward": "eval/reward"}
    rewards = {label: _series(metrics, key) for label, key in names.items()}
    drawn = _line_chart({k: v for k, v in rewards.items() if v}, charts.Names("step", "Reward", "reward"))
    # Multi-turn episodes (train.rl.environment): turns, tool calls and their failures by step.
    episodes = {"turns per episode": "rl/episode/turns", "tool calls per episode": "rl/episode/tool_calls",
                "tool errors": "rl/episode/tool_errors", "tool timeouts": "rl/episode/tool_timeouts",
                "truncated episodes": "rl/episode/truncated"}  # fmt: skip
    series = {label: _series(metrics, key) for label, key in episodes.items()}
    if any(series.values()):
        drawn += _line_chart({k: v for k, v in series.items() if v}, charts.Names("step", "Episodes", "episodes"))
    table = _mapping_table(summary) if summary else ""
    return f"<h2>Reinforcement learning (GRPO)</h2>{table}<div class='charts'>{drawn}</div>"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _line_chart(series: Mapping[str, Sequence[tuple[float, float]]], names: charts.Names) -> str:
    """Named (step, value) series as one chart with its legend, in the report's colours."""
    lines = [charts.Series(name, points, charts.color(i, _COLORS)) for i, (name, points) in enumerate(series.items())]
    return charts.line_chart(lines, names, legend=True)


def _compare_section(summary: CompareSummary) -> str:
    rows = []
    for label, model in summary.models.items():
        for metric, m in model.metrics.items():
            e = m.estimate
            rows.append(
                f"<tr><td>{escape(label)}</td><td>{escape(metric)}</td><td class='num'>{e.value:.3f}</td>"
                f"<td class='num'>[{e.ci_low:.3f}, {e.ci_high:.3f}]</td><td class='num'>{e.n}</td></tr>"
            )
    tests = []
    for pair in summary.pairs:
        for metric, t in pair.tests.items():
            verdict = (
                "<span class='ok'>significant</span>" if t.significant else "<span class='bad'>not significant</span>"
            )
            tests.append(
                f"<tr><td>{escape(pair.a)} vs {escape(pair.b)}</td><td>{escape(metric)}</td><td>{escape(t.test)}</td>"
                f"<td class='num'>{t.difference:+.3f} ({difference_interval(t, summary.confidence)})</td>"
                f"<td class='num'>{t.p_value:.3g}</td><td>{verdict}</td></tr>"
            )
    table = (
        f"<table><tr><th>model</th><th>metric</th><th>value</th><th>{level_text(summary.confidence)} interval</th>"
        "<th>n</th></tr>" + "".join(rows) + "</table>"
    )
    paired = (
        "<table><tr><th>pair</th><th>metric</th><th>test</th><th>difference (interval)</th><th>p-value</th>"
        "<th>verdict</th></tr>" + "".join(tests) + "</table>"
        if tests
        else ""
    )
    bars = _bar_chart(summary)
    episodes = "".join(episodes_html(summary))  # the models evaluated in an environment: compare.html's section
    return f"<h2>Base vs fine-tuned</h2>{table}{paired}{bars}{episodes}"


def _bar_chart(summary: CompareSummary) -> str:
    """Every model's metrics as horizontal bars with their intervals, a colour per bar."""
    rows = [(label, name, m.estimate) for label, model in summary.models.items() for name, m in model.metrics.items()]
    shown = [(label, name, e) for label, name, e in rows if _finite(e.value)]
    bars = [
        charts.Bar(name, label, float(e.value), e.ci_low, e.ci_high, charts.color(i, _COLORS))
        for i, (label, name, e) in enumerate(shown)
    ]
    return charts.bar_rows_chart(bars, label="metrics")


def _examples_section(examples: Sequence[Mapping[str, Any]], limit: int = 12) -> str:
    labels = list(examples[0].get("models", {})) if examples else []
    head = "".join(f"<th>{escape(label)}</th>" for label in labels)
    rows = []
    for example in examples[:limit]:
        cells = []
        for label in labels:
            result = example["models"][label]
            mark = "<span class='ok'>✓</span>" if result.get("correct") else "<span class='bad'>✗</span>"
            cells.append(f"<td>{mark}<pre>{escape(str(result.get('output', '')))}</pre></td>")
        rows.append(
            f"<tr><td><pre>{escape(str(example.get('question', example.get('prompt', ''))))}</pre></td>"
            f"<td><pre>{escape(str(example.get('reference', '')))}</pre></td>{''.join(cells)}</tr>"
        )
    return (
        f"<h2>Examples</h2><p class='muted'>First {min(limit, len(examples))} held-out problems, outputs side by "
        f"side.</p><table><tr><th>question</th><th>reference</th>{head}</tr>{''.join(rows)}</table>"
    )
