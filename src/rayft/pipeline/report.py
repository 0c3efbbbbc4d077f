"""report.html: one self-contained page (inline CSS and SVG, no scripts, no network) that tells what
a pipeline run did — stage timings, synthetic-data counts, training curves, base vs fine-tuned."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from rayft.evaluation.report import difference_interval, level_text
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


def _training_section(metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    def series(key: str) -> list[tuple[float, float]]:
        return [(float(r["step"]), float(r[key])) for r in metrics if key in r and _finite(r[key])]

    loss = {"train loss": series("train/loss"), "validation loss": series("eval/loss")}
    charts = [
        svg_line_chart({k: v for k, v in loss.items() if v}, title="Loss", y_label="loss"),
        svg_line_chart({"learning rate": series("train/learning_rate")}, title="Learning rate", y_label="lr"),
    ]
    table = _mapping_table(summary) if summary else ""
    return f"<h2>Training</h2>{table}<div class='charts'>{''.join(c for c in charts if c)}</div>"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def svg_line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    y_label: str,
    width: int = 520,
    height: int = 300,
) -> str:
    """An inline SVG line chart of one or more (x, y) series, with axes, ticks and a legend."""
    points = [p for values in series.values() for p in values]
    if not points:
        return ""
    left, right, top, bottom = 70, 15, 30, 40
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y_lo, y_hi = min(ys), max(ys)
    pad = (y_hi - y_lo) * 0.05 or abs(y_hi) * 0.05 or 1.0
    y_lo, y_hi = y_lo - pad if y_lo < 0 else max(y_lo - pad, 0.0), y_hi + pad

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * (width - left - right)

    def sy(y: float) -> float:
        return top + (y_hi - y) / (y_hi - y_lo) * (height - top - bottom)

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='{escape(title)}'><rect width='100%' height='100%' fill='white'/>",
        f"<text x='{width / 2}' y='18' text-anchor='middle' font-size='14' font-weight='600'>{escape(title)}</text>",
        f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' stroke='#333'/>",
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#333'/>",
    ]
    for i in range(5):
        y = y_lo + (y_hi - y_lo) * i / 4
        out.append(
            f"<text x='{left - 6}' y='{sy(y) + 4:.1f}' text-anchor='end' font-size='11'>{y:.3g}</text>"
            f"<line x1='{left}' y1='{sy(y):.1f}' x2='{width - right}' y2='{sy(y):.1f}' stroke='#eee'/>"
        )
        x = x_lo + (x_hi - x_lo) * i / 4
        out.append(
            f"<text x='{sx(x):.1f}' y='{height - bottom + 16}' text-anchor='middle' font-size='11'>{x:.0f}</text>"
        )
    out.append(f"<text x='{width / 2}' y='{height - 6}' text-anchor='middle' font-size='12'>step</text>")
    out.append(
        f"<text x='14' y='{height / 2}' text-anchor='middle' font-size='12' "
        f"transform='rotate(-90 14 {height / 2})'>{escape(y_label)}</text>"
    )
    for index, (name, values) in enumerate(series.items()):
        color = _COLORS[index % len(_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values))
        out.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{path}'/>")
        if len(values) == 1:
            x, y = values[0]
            out.append(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='3' fill='{color}'/>")
        out.append(
            f"<rect x='{width - right - 150}' y='{top + 6 + 16 * index}' width='10' height='10' fill='{color}'/>"
            f"<text x='{width - right - 135}' y='{top + 15 + 16 * index}' font-size='11'>{escape(name)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


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
    return f"<h2>Base vs fine-tuned</h2>{table}{paired}{bars}"


def _bar_chart(summary: CompareSummary) -> str:
    bars = []
    for label, model in summary.models.items():
        for metric, m in model.metrics.items():
            e = m.estimate
            if _finite(e.value):
                bars.append((f"{label} · {metric}", float(e.value), e.ci_low, e.ci_high))
    if not bars:
        return ""
    width, row, left = 620, 26, 230
    highs = [float(b[3]) for b in bars if isinstance(b[3], int | float) and _finite(b[3])]
    top_value = max(*(b[1] for b in bars), *highs, 1e-9)
    height = row * len(bars) + 20
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' aria-label='metrics'>"
    ]
    for i, (name, value, low, high) in enumerate(bars):
        y = 10 + i * row
        length = value / top_value * (width - left - 60)
        color = _COLORS[i % len(_COLORS)]
        out.append(
            f"<text x='{left - 8}' y='{y + 15}' text-anchor='end' font-size='12'>{escape(name)}</text>"
            f"<rect x='{left}' y='{y + 3}' width='{max(length, 1):.1f}' height='16' fill='{color}'/>"
        )
        label_x = left + length + 6
        if isinstance(low, int | float) and isinstance(high, int | float) and _finite(low) and _finite(high):
            x1 = left + float(low) / top_value * (width - left - 60)
            x2 = left + float(high) / top_value * (width - left - 60)
            out.append(
                f"<line x1='{x1:.1f}' y1='{y + 11}' x2='{x2:.1f}' y2='{y + 11}' stroke='#111' stroke-width='2'/>"
            )
            label_x = max(label_x, x2 + 6)
        out.append(f"<text x='{label_x:.1f}' y='{y + 15}' font-size='12'>{value:.3f}</text>")
    out.append("</svg>")
    return "".join(out)


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
