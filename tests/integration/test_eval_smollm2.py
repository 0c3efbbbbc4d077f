"""The built-in SmolLM2-135M-Instruct evaluated on a few held-out arithmetic problems (CPU, slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smollm2_gsm8k_eval_scores_real_answers(tmp_path: Path) -> None:
    from rayft.recipes.evaluate import evaluate_model

    cfg = load_config(
        None,
        [
            "model.name=smollm2-135m-instruct",
            "eval.max_samples=3",
            "eval.batch_size=3",
            "eval.runtime=local",
            "eval.generation.max_new_tokens=32",
            "eval.bootstrap_samples=200",
        ],
    )
    result = evaluate_model(cfg, "smollm2-135m-instruct", tmp_path / "eval")
    rows = [json.loads(line) for line in result.predictions_path.read_text().splitlines()]
    assert len(rows) == 3
    assert all(row["error"] is None and row["output"].strip() for row in rows)
    assert all(0 < row["num_generated_tokens"] <= 32 for row in rows)
    # An instruct model answers with numbers: the flexible extraction finds some.
    assert any(row["extracted"]["flexible"] != "[invalid]" for row in rows)
    assert rows[0]["prompt"][-1]["content"].startswith("Question: ")
    report = json.loads(result.json_path.read_text())
    assert "base/SmolLM2-135M-Instruct.Q4_1.gguf" in report["fingerprint"]["files"]
    for name in ("accuracy_strict", "accuracy_flexible"):
        metric = report["metrics"][name]
        assert metric["n"] == 3
        assert metric["ci_low"] <= metric["value"] <= metric["ci_high"]
