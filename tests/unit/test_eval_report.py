"""Reports from constructed model runs: paired tests, disagreements, and a self-contained HTML page."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.evaluation.report import (
    comparison_examples,
    console_table,
    disagreements,
    model_summary,
    pair_tests,
    render_html,
    render_markdown,
)
from rayft.evaluation.runner import Example, Examples, ModelRun, choose_runtime, score_run
from rayft.evaluation.stats import mcnemar_test
from rayft.evaluation.summary import CompareSummary
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource

N = 12
REFS = [f"... so the answer is {i}.\n#### {i}" for i in range(N)]


def _run(label: str, outputs: list[str]) -> ModelRun:
    task = build_task(EvalConfig(task="gsm8k"))
    examples = _examples()
    gens = [Generation(text, 10, 5) for text in outputs]
    source = ResolvedSource(label, "model", ModelConfig(name=f"org/{label}"))
    return score_run(label, source, examples, gens, task=task, ev=EvalConfig(bootstrap_samples=200), elapsed_s=1.0)


def _examples() -> Examples:
    return Examples([Example(f"ds:{i}", f"What is {i} <b>?</b>", REFS[i], f"Question: {i}") for i in range(N)], [])


def _runs() -> list[ModelRun]:
    # base gets the first 2 right; tuned the first 10: 8 discordant pairs, all for tuned -> p = 2 / 2**8.
    base = [f"#### {i}" if i < 2 else "no idea" for i in range(N)]
    tuned = [f"#### {i}" if i < 10 else "#### 99" for i in range(N)]
    return [_run("base", base), _run("tuned", tuned)]


def test_scores_and_intervals_of_a_run() -> None:
    base, tuned = _runs()
    assert base.metrics["accuracy_strict"].value == pytest.approx(2 / N)
    assert tuned.metrics["accuracy_flexible"].value == pytest.approx(10 / N)
    assert tuned.metrics["accuracy_flexible"].method == "wilson"
    assert base.extracted[5] == {"strict": "[invalid]", "flexible": "[invalid]"}


def test_pair_tests_give_the_known_mcnemar_p_value() -> None:
    pairs = pair_tests(_runs(), 0.95, 0.05, 200, 0)
    assert [(p.a, p.b) for p in pairs] == [("base", "tuned")]
    strict = pairs[0].tests["accuracy_strict"]
    assert strict.test == "mcnemar"
    assert strict.p_value == pytest.approx(math.erfc(2))  # z = 8 / sqrt(8)
    assert strict.significant is True
    assert strict.difference == pytest.approx(8 / N)
    assert strict.detail["only_b_correct"] == 8


def test_compare_line_and_headline_at_the_boundary_reach_above_the_estimate() -> None:
    # 100 examples, base never right, tuned right on 27: the conditional interval printed
    # "+0.270 95% CI [+0.201, +0.270]"; Tango's interval reaches the Wilson upper bound of 27 / 100.
    from rayft.evaluation.report import pair_lines
    from rayft.evaluation.summary import PairComparison

    test = mcnemar_test([0.0] * 100, [1.0] * 27 + [0.0] * 73)
    summary = dataclasses.replace(
        _summary(_runs()), pairs=[PairComparison("base", "tuned", {"accuracy_flexible": test})]
    )
    line = "tuned - base accuracy_flexible: +0.270 95% CI [+0.193, +0.364], mcnemar p=2.035e-07 (significant)"
    assert pair_lines(summary) == [line, "    0 right-to-wrong, 27 wrong-to-right"]
    assert summary.headline() == (
        "accuracy_flexible: base 0.167, tuned 0.833; difference +0.270 95% CI [+0.193, +0.364], "
        "mcnemar p=2.03e-07 (significant)"
    )


def _summary(runs: list[ModelRun]) -> CompareSummary:
    return CompareSummary(
        task="gsm8k",
        num_examples=N,
        num_fewshot=0,
        confidence=0.95,
        significance=0.05,
        primary_metric="accuracy_flexible",
        models={r.label: model_summary(r) for r in runs},
        pairs=pair_tests(runs, 0.95, 0.05, 200, 0),
    )


def test_compare_summary_round_trips_through_its_json_form() -> None:
    summary = _summary(_runs())
    plain = json.loads(json.dumps(summary.to_dict()))
    assert plain["models"]["tuned"]["metrics"]["accuracy_flexible"]["kind"] == "binary"
    assert plain["pairs"][0]["tests"]["accuracy_strict"]["test"] == "mcnemar"
    assert CompareSummary.from_dict(plain) == summary
    headline = summary.headline()
    assert headline is not None and headline.startswith("accuracy_flexible: base 0.167, tuned 0.833; difference +0.667")


def test_html_is_self_contained_and_escapes_text() -> None:
    runs = _runs()
    rows = comparison_examples(runs, _examples())
    page = render_html(_summary(runs), rows)
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "</svg>" in page and "<rect" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page), "the page must not fetch anything"
    assert "<script" not in page
    assert "What is 2 &lt;b&gt;?&lt;/b&gt;" in page  # question text is escaped
    assert "<b>?</b>" not in page
    assert page.count('class="example"') == 8  # the 8 examples where the models disagree
    assert "mcnemar" in page


def test_markdown_and_console_table() -> None:
    runs = _runs()
    summary = _summary(runs)
    rows = comparison_examples(runs, _examples())
    md = render_markdown(summary, rows)
    assert "| tuned vs base | accuracy_strict | mcnemar | +0.667 |" in md
    assert "## Examples where the models disagree (8 shown)" in md
    table = console_table(summary.models, 0.95)
    assert "tuned  accuracy_flexible  0.833" in table
    assert len(disagreements(rows, "accuracy_flexible", limit=3)) == 3


def test_comparison_rows_hold_each_models_answer() -> None:
    rows = comparison_examples(_runs(), _examples())
    assert rows[5]["models"]["base"]["correct"] is False
    assert rows[5]["models"]["tuned"]["correct"] is True
    assert rows[5]["models"]["tuned"]["extracted"]["strict"] == "5"
    assert rows[5]["reference"] == REFS[5]


@pytest.mark.parametrize(
    ("setting", "running", "address", "expected"),
    [("auto", False, None, "local"), ("auto", True, None, "ray"), ("auto", False, "ray://h:10001", "ray"),
     ("local", True, None, "local"), ("ray", False, None, "ray")],
)  # fmt: skip
def test_choose_runtime(setting: str, running: bool, address: str | None, expected: str) -> None:
    assert choose_runtime(setting, running, address) == expected


def test_every_report_states_the_configured_confidence_level() -> None:
    from rayft.evaluation.report import pair_lines
    from rayft.pipeline.report import ReportInputs, StageRow, render_report

    runs = _runs()
    summary = dataclasses.replace(_summary(runs), confidence=0.9, pairs=pair_tests(runs, 0.9, 0.1, 200, 0))
    rows = comparison_examples(runs, _examples())
    pipeline = render_report(ReportInputs(name="r", stages=[StageRow("eval", "run", "", 1.0)], compare_summary=summary))
    outputs = {
        "markdown": render_markdown(summary, rows),
        "html": render_html(summary, rows),
        "console table": console_table(summary.models, 0.9),
        "console pairs": "\n".join(pair_lines(summary)),
        "pipeline report": pipeline,
        "pipeline headline": summary.headline() or "",
    }
    for where, text in outputs.items():
        assert "90%" in text, where
        assert "95%" not in text, where
