"""Evaluation reports: JSON summaries, per-example rows, a console table, Markdown, and a
self-contained HTML page (inline CSS and an inline SVG bar chart, nothing fetched: it reads
offline). Files are written to a temporary name beside the target and renamed into place.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rayft import charts
from rayft.evaluation.runner import CorpusScores, Example, Examples, ModelRun
from rayft.evaluation.stats import PairedTest, corpus_paired_test, paired_test
from rayft.evaluation.summary import CompareSummary, MetricSummary, ModelSummary, PairComparison
from rayft.evaluation.tasks import Scored
from rayft.files import write_jsonl_atomic
from rayft.generation.backend import Generation
from rayft.pages import html_page

MAX_DISAGREEMENTS = 50


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """One JSON object per line, written atomically (:func:`rayft.files.write_jsonl_atomic`)."""
    return write_jsonl_atomic(path, rows)


def metrics_summary(run: ModelRun) -> dict[str, MetricSummary]:
    """Per metric: value, interval, n, the interval method and the metric's kind."""
    return {name: MetricSummary(est, run.kinds[name]) for name, est in run.metrics.items()}


def model_summary(run: ModelRun) -> ModelSummary:
    """What was evaluated and how it did, for eval.json and compare.json."""
    return ModelSummary(
        source=run.source.source,
        resolved=run.source.describe(),
        kind=run.source.kind,
        step=run.source.step,
        training_metrics=run.source.metrics,
        lineage=run.source.lineage,
        fingerprint=run.fingerprint,
        metrics=metrics_summary(run),
        primary_metric=run.primary,
        generation_errors=run.errors,
        generated_tokens=run.generated_tokens,
        elapsed_s=round(run.elapsed_s, 3),
        episodes=run.episodes,
    )


def example_record(example: Example, generation: Generation, scored: Scored) -> dict[str, Any]:
    """One example's row as scored by one model, before its ``correct`` is known (that needs the
    primary metric's kind, known once every example is scored)."""
    return {
        "id": example.id,
        "question": example.question,
        "prompt": example.prompt,
        "reference": example.reference,
        "output": generation.text,
        "extracted": scored.extracted,
        "scores": scored.scores,
        "finish_reason": generation.finish_reason,
        "error": generation.error,
        "num_generated_tokens": generation.num_generated_tokens,
    } | ({"episode": generation.extra["episode"]} if "episode" in generation.extra else {})


def prediction_row(record: Mapping[str, Any], run: ModelRun) -> dict[str, Any]:
    """The predictions.jsonl row of one example record (:func:`example_record`) of ``run``."""
    keys = ("id", "question", "prompt", "reference", "output", "extracted", "scores")
    row = {key: record[key] for key in keys}
    row["correct"] = run.correct(record["scores"])
    row.update({key: record[key] for key in ("finish_reason", "error", "num_generated_tokens")})
    if "episode" in record:
        row["episode"] = record["episode"]
    return row


def comparison_row(records: Sequence[Mapping[str, Any]], runs: Sequence[ModelRun]) -> dict[str, Any]:
    """The examples.jsonl row of one example: its records by each of ``runs`` (in the same order)."""
    first = records[0]
    models = {
        run.label: {
            "output": record["output"],
            "extracted": record["extracted"],
            "scores": record["scores"],
            "correct": run.correct(record["scores"]),
            "error": record["error"],
        }
        | ({"episode": record["episode"]} if "episode" in record else {})
        for run, record in zip(runs, records, strict=True)
    }
    return {key: first[key] for key in ("id", "question", "prompt", "reference")} | {"models": models}


def _records(run: ModelRun, examples: Examples) -> list[dict[str, Any]]:
    """The example records of a run held in memory (:func:`~rayft.evaluation.runner.run_model`)."""
    scored = [Scored(s, e) for s, e in zip(run.scores, run.extracted, strict=True)]
    return [example_record(*item) for item in zip(examples.items, run.generations, scored, strict=True)]


def prediction_rows(run: ModelRun, examples: Examples) -> list[dict[str, Any]]:
    """The per-example rows of one model held in memory: prompt, output, extracted answers, reference, scores."""
    return [prediction_row(record, run) for record in _records(run, examples)]


def pair_tests(
    runs: Sequence[ModelRun], confidence: float, alpha: float, samples: int, seed: int, *, margins: Sequence[float] = ()
) -> list[PairComparison]:
    """Paired tests of every metric for every pair of models (difference = later - earlier), each with
    a TOST equivalence test at every one of ``margins``."""
    out = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            tests: dict[str, PairedTest] = {}
            for name, kind in a.kinds.items():
                if name not in b.kinds:
                    continue
                if name in a.corpus and name in b.corpus:
                    tests[name] = corpus_pair_test(
                        a.corpus[name], b.corpus[name], confidence=confidence, alpha=alpha, samples=samples,
                        seed=seed, margins=margins,
                    )  # fmt: skip
                    continue
                va, vb = a.values[name].tolist(), b.values[name].tolist()
                test: PairedTest = paired_test(
                    "binary" if kind == "binary" and b.kinds[name] == "binary" else "continuous",
                    va, vb, confidence=confidence, alpha=alpha, samples=samples, seed=seed, margins=margins,
                )  # fmt: skip
                tests[name] = test
            out.append(PairComparison(a.label, b.label, tests))
    return out


def corpus_pair_test(
    a: CorpusScores,
    b: CorpusScores,
    *,
    confidence: float,
    alpha: float,
    samples: int,
    seed: int,
    margins: Sequence[float] = (),
) -> PairedTest:
    """A corpus metric's paired test: the metric's own test for the p-value, a paired bootstrap interval."""
    p = a.metric.paired_p_value(a.outputs, b.outputs, a.references, samples, seed)
    test = corpus_paired_test(
        a.statistics, b.statistics, a.metric.from_statistics, test=a.metric.test, p_value=p,
        confidence=confidence, alpha=alpha, samples=samples, seed=seed, margins=margins,
    )  # fmt: skip
    return test


def comparison_examples(runs: Sequence[ModelRun], examples: Examples) -> list[dict[str, Any]]:
    """Per example of runs held in memory: prompt, reference, and each model's output, extracted
    answer, correctness."""
    return [comparison_row(records, runs) for records in zip(*(_records(r, examples) for r in runs), strict=True)]


def spread(row: Mapping[str, Any], primary: str) -> float:
    """How far apart the models' primary scores are on one comparison row."""
    values = [float(m["scores"].get(primary, 0.0)) for m in row["models"].values()]
    return max(values) - min(values)


def disagreements(rows: Sequence[dict[str, Any]], primary: str, limit: int = MAX_DISAGREEMENTS) -> list[dict[str, Any]]:
    """Examples where the models' primary scores differ, the largest differences first."""
    differing = [r for r in rows if spread(r, primary) > 0]
    return sorted(differing, key=lambda r: spread(r, primary), reverse=True)[:limit]


def level_text(confidence: float) -> str:
    """A confidence level as a percentage: 0.95 -> '95%', 0.975 -> '97.5%'."""
    return f"{confidence * 100:.4g}%"


def difference_interval(test: PairedTest, fallback: float | None = None) -> str:
    """A paired difference's interval with its own level, e.g. '95% CI [+0.012, +0.088]'.

    Each test carries the level of its interval (an exact test's is 1 - significance);
    ``fallback`` stands in where a test has none.
    """
    level = test.confidence if math.isfinite(test.confidence) else fallback
    bounds = f"[{test.diff_ci_low:+.3f}, {test.diff_ci_high:+.3f}]"
    return f"{level_text(level)} CI {bounds}" if level is not None else f"CI {bounds}"


def equivalence_text(test: PairedTest) -> str:
    """The TOST verdicts of a test, e.g. 'equivalent within +-0.020: no (TOST p=0.31)'; '' when none ran."""
    parts = [
        f"equivalent within +-{e.margin:.3g}: {'yes' if e.equivalent else 'no'} (TOST p={e.p_value:.3g})"
        for e in test.equivalence
    ]
    return "; ".join(parts)


def flips_text(test: PairedTest) -> str:
    """A binary metric's flips, e.g. '3 right-to-wrong, 12 wrong-to-right'; '' for a continuous metric."""
    if not test.flips:
        return ""
    return f"{test.flips['right_to_wrong']} right-to-wrong, {test.flips['wrong_to_right']} wrong-to-right"


def pair_lines(summary: CompareSummary) -> list[str]:
    """Per pair and metric, a console line with the difference, interval, test, p-value and verdict,
    and an indented one with the equivalence tests and the flips."""
    lines = []
    for pair in summary.pairs:
        for name, test in pair.tests.items():
            verdict = "significant" if test.significant else "not significant"
            lines.append(
                f"{pair.b} - {pair.a} {name}: {test.difference:+.3f} "
                f"{difference_interval(test, summary.confidence)}, {test.test} p={test.p_value:.4g} ({verdict})"
            )
            more = "; ".join(part for part in (equivalence_text(test), flips_text(test)) if part)
            if more:
                lines.append(f"    {more}")
    lines += [f"gate {g.gate!r}: {'passed' if g.passed else 'FAILED'}: {g.evidence}" for g in summary.gates]
    return lines


def _fmt(value: float, scale: float = 1.0) -> str:
    return f"{value * scale:.3f}" if scale == 1.0 else f"{value * scale:.1f}"


def console_table(summary_models: Mapping[str, ModelSummary], confidence: float) -> str:
    """A plain-text table: one row per model and metric, with the interval."""
    head = ("model", "metric", "value", f"{level_text(confidence)} interval", "n")
    rows = [head]
    for label, model in summary_models.items():
        for name, m in model.metrics.items():
            e = m.estimate
            rows.append((label, name, _fmt(e.value), f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]", str(e.n)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{label}: {episodes_text(model.episodes)}" for label, model in summary_models.items() if model.episodes]
    return "\n".join(lines)


def episodes_text(episodes: Mapping[str, Any]) -> str:
    """One line of an environment eval's episode figures."""
    tools = "with tools" if episodes.get("with_tools", True) else "without tools"
    by_tool = ", ".join(f"{name} {n}" for name, n in episodes.get("tool_calls_by_tool", {}).items()) or "none"
    return (
        f"{episodes['episodes']} episodes {tools}: {episodes['mean_turns']:g} turns and "
        f"{episodes['mean_tool_calls']:g} tool calls each ({by_tool}); {episodes['tool_errors']} tool errors, "
        f"{episodes['tool_timeouts']} timeouts, {episodes['truncated']} truncated, {episodes['failed']} failed"
    )


def episodes_markdown(models: Mapping[str, ModelSummary]) -> list[str]:
    """compare.md's section of episode figures (none when no model ran in an environment)."""
    rows = [f"- **{label}**: {episodes_text(model.episodes)}" for label, model in models.items() if model.episodes]
    return ["", "## Episodes", "", *rows] if rows else []


def render_markdown(summary: CompareSummary, rows: Sequence[dict[str, Any]]) -> str:
    """compare.md: metrics with intervals, paired tests, and the examples where models disagree."""
    conf = summary.confidence
    out = [f"# Comparison: {' vs '.join(summary.models)}", ""]
    out += [f"Task `{summary.task}`, {summary.num_examples} examples.", ""]
    out += ["## Metrics", "", f"| model | metric | value | {level_text(conf)} interval | n |", "|---|---|---|---|---|"]
    for label, model in summary.models.items():
        for name, metric in model.metrics.items():
            m = metric.estimate
            out.append(f"| {label} | {name} | {_fmt(m.value)} | [{_fmt(m.ci_low)}, {_fmt(m.ci_high)}] | {m.n} |")
    out += [
        "",
        "## Paired tests",
        "",
        "| pair | metric | test | difference (b - a) | interval | p-value | significant | equivalence | flips |",
    ]
    out.append("|---|---|---|---|---|---|---|---|---|")
    for pair in summary.pairs:
        for name, t in pair.tests.items():
            out.append(
                f"| {pair.b} vs {pair.a} | {name} | {t.test} | {t.difference:+.3f} | "
                f"{difference_interval(t, conf)} | {t.p_value:.4g} | "
                f"{'yes' if t.significant else 'no'} | {equivalence_text(t) or '-'} | {flips_text(t) or '-'} |"
            )
    out += episodes_markdown(summary.models)
    if summary.gates:
        out += ["", "## Gates", "", "| gate | passed | evidence |", "|---|---|---|"]
        out += [f"| `{g.gate}` | {'yes' if g.passed else 'no'} | {g.evidence} |" for g in summary.gates]
    shown = disagreements(rows, summary.primary_metric)
    out += ["", f"## Examples where the models disagree ({len(shown)} shown)", ""]
    for row in shown:
        out += [
            f"### {row['id']}",
            "",
            f"**Question:** {row['question']}",
            "",
            f"**Reference:** {row['reference']}",
            "",
        ]
        for label, m in row["models"].items():
            verdict = {True: "correct", False: "wrong", None: ""}[m["correct"]]
            out += [f"**{label}** {verdict}:", "", "```", m["output"].replace("```", "'''"), "```", ""]
    return "\n".join(out) + "\n"


# compare.html's own rules, after the shared page style (rayft.pages).
_CSS = """.yes{color:#0a7d32;font-weight:600}.no{color:#666}
pre{background:#f8f8f8;border:1px solid #e5e5e5;padding:.5rem;margin:.2rem 0}
.example{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;margin:1rem 0}
"""


def _svg_chart(summary: CompareSummary) -> str:
    """A grouped bar chart of every metric per model, with interval whiskers (inline SVG)."""
    bars = [
        charts.Bar(name, label, m.estimate.value, m.estimate.ci_low, m.estimate.ci_high, charts.color(mi))
        for mi, (label, model) in enumerate(summary.models.items())
        for name, m in model.metrics.items()
    ]
    return charts.grouped_bar_chart(bars, label="metrics by model")


def _gates_html(summary: CompareSummary) -> list[str]:
    """compare.html's table of promotion gates (nothing when none was asked for)."""
    if not summary.gates:
        return []
    rows = [
        f"<tr><td><code>{html.escape(g.gate)}</code></td><td>{_YES if g.passed else _NO_BAD}</td>"
        f"<td>{html.escape(g.evidence)}</td></tr>"
        for g in summary.gates
    ]
    return ["<h2>Gates</h2>", "<table><tr><th>gate</th><th>passed</th><th>evidence</th></tr>", *rows, "</table>"]


_YES, _NO_BAD = '<span class="yes">yes</span>', '<span class="bad">no</span>'


def episodes_html(summary: CompareSummary) -> list[str]:
    """The episode figures of the models evaluated in an environment, for compare.html and the pipeline's report:
    a table (episodes, turns and tool calls per episode, calls per tool, tool errors, timeouts, truncated and failed
    episodes, the reward) and a chart of the per-episode means; nothing when no model ran episodes."""
    models = {label: model for label, model in summary.models.items() if model.episodes}
    if not models:
        return []
    tools = list(dict.fromkeys(t for m in models.values() for t in m.episodes.get("tool_calls_by_tool", {})))
    head = ["model", "tools", "episodes", "turns / episode", "tool calls / episode",
            *(f"{t} calls" for t in tools), "tool errors", "timeouts", "truncated", "failed", "reward"]  # fmt: skip
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for label, model in models.items():
        ep = model.episodes
        cells = [label, "with" if ep.get("with_tools", True) else "without", str(ep["episodes"]),
                 f"{ep['mean_turns']:g}", f"{ep['mean_tool_calls']:g}",
                 *(str(ep.get("tool_calls_by_tool", {}).get(t, 0)) for t in tools),
                 _by_kind(ep["tool_errors"], ep.get("tool_errors_by_tool", {})), str(ep["tool_timeouts"]),
                 _by_kind(ep["truncated"], ep.get("truncated_by_limit", {})), str(ep["failed"]),
                 _reward_text(model)]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ["<h2>Episodes</h2>", "<table>", *rows, "</table>", _episodes_chart(models, tools)]


def _by_kind(total: int, kinds: Mapping[str, int]) -> str:
    """A count with its parts, e.g. '3 (calculator 2, <unknown> 1)'."""
    parts = ", ".join(f"{name} {n}" for name, n in kinds.items() if n)
    return f"{total} ({parts})" if parts else str(total)


def _reward_text(model: ModelSummary) -> str:
    """An episode's reward as the eval measured it: a user environment's metric 'reward', else the score of the
    final answers (the primary metric, what the rewards of a tools environment score), named."""
    name = "reward" if "reward" in model.metrics else model.primary_metric
    metric = model.metrics.get(name)
    return f"{metric.estimate.value:.3f} ({name})" if metric is not None else "-"


def _episodes_chart(models: Mapping[str, ModelSummary], tools: Sequence[str]) -> str:
    """Turns and tool calls (in all and per tool) per episode, a bar per model (inline SVG)."""
    bars = []
    for index, (label, model) in enumerate(models.items()):
        ep, colour = model.episodes, charts.color(index)
        count = max(int(ep["episodes"]), 1)
        means = {"turns": float(ep["mean_turns"]), "tool calls": float(ep["mean_tool_calls"])}
        means |= {f"{t} calls": ep.get("tool_calls_by_tool", {}).get(t, 0) / count for t in tools}
        bars += [charts.Bar(group, label, value, None, None, colour) for group, value in means.items()]
    return charts.grouped_bar_chart(bars, label="per episode, by model")


def render_html(summary: CompareSummary, rows: Sequence[dict[str, Any]]) -> str:
    """compare.html: one self-contained page (no scripts, fonts or styles from the network)."""
    e = html.escape
    conf = summary.confidence
    body = [f"<h1>Comparison: {e(' vs '.join(summary.models))}</h1>"]
    body.append(
        f'<p class="meta">Task <b>{e(summary.task)}</b>, {summary.num_examples} examples, '
        f"{level_text(conf)} intervals on metrics. Generated by rayft.</p>"
    )
    body += ["<h2>Models</h2>", "<table><tr><th>label</th><th>model</th><th>step</th><th>fingerprint</th></tr>"]
    for label, model in summary.models.items():
        fp = (model.fingerprint.get("sha256") or "")[:16]
        body.append(
            f"<tr><td>{e(label)}</td><td>{e(model.resolved)}</td><td>{e(str(model.step or ''))}</td>"
            f"<td><code>{e(fp)}</code></td></tr>"
        )
    body += ["</table>", "<h2>Metrics</h2>", _svg_chart(summary)]
    body.append(
        f"<table><tr><th>model</th><th>metric</th><th>value</th><th>{level_text(conf)} interval</th><th>n</th></tr>"
    )
    for label, model in summary.models.items():
        for name, metric in model.metrics.items():
            m = metric.estimate
            body.append(
                f"<tr><td>{e(label)}</td><td>{e(name)}</td><td>{m.value:.3f}</td>"
                f"<td>[{m.ci_low:.3f}, {m.ci_high:.3f}]</td><td>{m.n}</td></tr>"
            )
    body += ["</table>", "<h2>Paired tests</h2>"]
    body.append(
        "<table><tr><th>pair</th><th>metric</th><th>test</th><th>difference (b &minus; a)</th><th>interval</th>"
        "<th>p-value</th><th>significant</th><th>equivalence (TOST)</th><th>flips</th></tr>"
    )
    for pair in summary.pairs:
        for name, t in pair.tests.items():
            sig = '<span class="yes">yes</span>' if t.significant else '<span class="no">no</span>'
            body.append(
                f"<tr><td>{e(pair.b)} vs {e(pair.a)}</td><td>{e(name)}</td><td>{e(t.test)}</td>"
                f"<td>{t.difference:+.3f}</td><td>{difference_interval(t, conf)}</td>"
                f"<td>{t.p_value:.4g}</td><td>{sig}</td><td>{e(equivalence_text(t) or '-')}</td>"
                f"<td>{e(flips_text(t) or '-')}</td></tr>"
            )
    body.append("</table>")
    body += episodes_html(summary)
    body += _gates_html(summary)
    shown = disagreements(rows, summary.primary_metric)
    body.append(f"<h2>Examples where the models disagree ({len(shown)} shown)</h2>")
    if not shown:
        body.append("<p>The models agree on every example.</p>")
    for row in shown:
        body.append(f'<div class="example"><p><b>{e(row["id"])}</b>: {e(row["question"])}</p>')
        body.append(f'<p><b>Reference:</b></p><pre class="ref">{e(row["reference"])}</pre>')
        for label, m in row["models"].items():
            verdict = {True: '<span class="ok">correct</span>', False: '<span class="bad">wrong</span>', None: ""}
            body.append(f"<p><b>{e(label)}</b> {verdict[m['correct']]}</p><pre>{e(m['output'])}</pre>")
            body += [f'<p class="meta">{e(k)}: {e(str(v))}</p>' for k, v in m.get("extracted", {}).items()]
        body.append("</div>")
    return html_page("rayft comparison", body, _CSS)
