"""The pipeline report: self-contained HTML with the stage table, curves and the comparison."""

from __future__ import annotations

import re

from rayft.evaluation.summary import CompareSummary
from rayft.pipeline.report import ReportInputs, StageRow, render_report


def _inputs() -> ReportInputs:
    metrics = [{"step": s, "train/loss": 2.0 / s, "train/learning_rate": 1e-3 * (1 - s / 10)} for s in range(1, 10)]
    metrics.append({"step": 9, "eval/loss": 0.4})
    compare = {
        "task": "gsm8k", "num_examples": 50, "num_fewshot": 0, "confidence": 0.9, "significance": 0.05,
        "primary_metric": "strict_accuracy",
        "models": {
            label: {"source": label, "resolved": label, "kind": "model", "step": None,
                    "primary_metric": "strict_accuracy", "metrics": {"strict_accuracy": {
                        "value": v, "ci_low": lo, "ci_high": hi, "n": 50, "method": "wilson", "kind": "binary"}}}
            for label, v, lo, hi in (("base", 0.1, 0.05, 0.2), ("tuned", 0.6, 0.45, 0.72))
        },
        "pairs": [
            {"a": "base", "b": "tuned", "tests": {"strict_accuracy": {"test": "mcnemar", "statistic": 0.0,
             "difference": 0.5, "diff_ci_low": 0.3, "diff_ci_high": 0.7, "p_value": 1e-6, "significant": True,
             "n": 50, "detail": {}}}},
        ],
    }  # fmt: skip
    examples = [
        {
            "question": "What is <b>2+2</b>?",
            "reference": "4",
            "models": {"base": {"output": "four", "correct": False}, "tuned": {"output": "#### 4", "correct": True}},
        }
    ]
    return ReportInputs(
        name="demo",
        stages=[StageRow("sdg", "run", "no finished output yet", 3.2), StageRow("train", "skip", "up to date", 0.0)],
        sdg_summary={
            "accepted": 90,
            "rejection_reasons": {"bad_annotation": 10},
            "stages": [{"stage": "generate", "rows_in": 100, "rejected": 10}],
        },
        train_metrics=metrics,
        compare_summary=CompareSummary.from_dict(compare),
        examples=examples,
    )


def test_report_is_self_contained_and_escaped() -> None:
    page = render_report(_inputs())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"(src|href)=['\"]https?://", page), "the report must not load anything from the network"
    assert "<script" not in page
    assert "&lt;b&gt;2+2&lt;/b&gt;" in page and "<b>2+2</b>" not in page
    for text in ("Stages", "Synthetic data", "bad_annotation", "Training", "Base vs fine-tuned", "mcnemar",
                 "significant", "[+0.300, +0.700]", "#### 4", "90% interval", "90% CI [+0.300, +0.700]"):  # fmt: skip
        assert text in page
    assert "<th>rows_in</th>" in page and "{'stage'" not in page  # records as a table, not a repr
    assert page.count("<svg") == 3  # loss, learning rate, bar chart
    assert "<b>strict_accuracy</b>: base 0.100 vs tuned 0.600; difference +0.500" in page
