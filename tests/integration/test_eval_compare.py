"""rayft eval / compare on the tiny model: Ray Data pool vs in-process, run directories, reports, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.config import RayftConfig, load_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA run: step 2 has the lowest eval/loss, step 4 and final/ the latest."""
    from tests.support.checkpoints import build_run_dir

    return build_run_dir(tmp_path_factory.mktemp("runs") / "run", tiny_model_dir, eval_losses={2: 0.5, 4: 0.9})


def _cfg(model_dir: Path, *overrides: str) -> RayftConfig:
    base = [
        f"model.name={model_dir}",
        "eval.max_samples=6",
        "eval.generation.max_new_tokens=6",
        "eval.batch_size=1",
        "eval.bootstrap_samples=200",
    ]
    return load_config(None, [*base, *overrides])


def test_the_ray_pool_matches_in_process_generation(
    ray_session: None, tiny_model_dir: Path, lora_run: Path, tmp_path: Path
) -> None:
    import torch

    from rayft.recipes.evaluate import evaluate_model

    pooled = evaluate_model(_cfg(tiny_model_dir, "eval.runtime=ray"), str(lora_run), tmp_path / "ray")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the 1-CPU actor, so that float reductions happen in the same order
    try:
        local = evaluate_model(_cfg(tiny_model_dir, "eval.runtime=local"), str(lora_run), tmp_path / "local")
    finally:
        torch.set_num_threads(threads)
    outputs = [[json.loads(x)["output"] for x in r.predictions_path.read_text().splitlines()] for r in (pooled, local)]
    assert len(outputs[0]) == 6
    assert outputs[0] == outputs[1]  # greedy decoding: the actor pool changes where, not what
    assert pooled.model.generation_errors == 0
    assert pooled.metrics == local.metrics


def test_compare_base_and_lora_run(tiny_model_dir: Path, lora_run: Path, tmp_path: Path) -> None:
    from rayft.recipes.compare import compare_models

    cfg = _cfg(tiny_model_dir, "eval.runtime=local", "eval.batch_size=4")
    result = compare_models(cfg, {"base": str(tiny_model_dir), "tuned": str(lora_run)}, tmp_path / "cmp")
    summary = result.summary
    assert set(summary.models) == {"base", "tuned"}
    tuned = summary.models["tuned"]
    assert tuned.kind == "lora"
    assert tuned.resolved.endswith(f"+ LoRA adapter {lora_run / 'final'}")  # on its base, not merged
    assert "adapter_model.safetensors" in tuned.fingerprint["files"]
    assert summary.models["base"].fingerprint["sha256"] != tuned.fingerprint["sha256"]
    for model in summary.models.values():
        for metric in ("accuracy_strict", "accuracy_flexible"):
            m = model.metrics[metric].estimate
            assert m.n == 6
            assert 0.0 <= m.ci_low <= m.value <= m.ci_high <= 1.0
    test = summary.pairs[0].tests["accuracy_flexible"]
    assert test.test == "mcnemar"
    assert 0.0 <= test.p_value <= 1.0
    assert len(result.examples) == 6
    assert set(result.examples[0]["models"]) == {"base", "tuned"}
    assert len(result.examples_path.read_text().splitlines()) == 6
    assert json.loads(result.json_path.read_text())["num_examples"] == 6
    page = result.html_path.read_text()
    assert "<svg" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "# Comparison: base vs tuned" in result.markdown_path.read_text()


def test_eval_cli_picks_the_best_checkpoint_and_writes_its_report(
    tiny_model_dir: Path, lora_run: Path, tmp_path: Path
) -> None:
    from rayft.cli.main import cli

    config = tmp_path / "cfg.yaml"
    config.write_text(f"name: cli\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n")
    out = tmp_path / "report"
    args = ["eval", str(config), "eval.max_samples=4", "eval.generation.max_new_tokens=4", "eval.runtime=local"]
    result = CliRunner().invoke(cli, [*args, "--model", str(lora_run), "--checkpoint", "best", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "accuracy_flexible" in result.output
    report = json.loads((out / "eval.json").read_text())
    assert report["step"] == 2  # the lowest eval/loss, not the latest
    assert report["source"] == str(lora_run)
    assert report["fingerprint"]["sha256"]
    assert report["metrics"]["accuracy_strict"]["method"] == "wilson"
    assert report["config"]["eval"]["checkpoint"] == "best"
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert {"prompt", "output", "extracted", "reference", "correct"} <= set(rows[0])


def test_compare_cli_errors_are_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.cli.main import cli

    config = tmp_path / "cfg.yaml"
    config.write_text(f"model:\n  name: {tiny_model_dir}\n")
    result = CliRunner().invoke(cli, ["compare", str(config), "--model", "base"])
    assert result.exit_code == 2
    assert "Error: --model 'base': expected LABEL=SOURCE" in result.output
    result = CliRunner().invoke(cli, ["compare", str(config), "--model", f"base={tiny_model_dir}"])
    assert result.exit_code == 2
    assert "compare needs at least two models, got 1 (base)" in result.output
    result = CliRunner().invoke(
        cli, ["eval", str(config), "--model", str(tmp_path / "missing-run"), "--checkpoint", "step-3"]
    )
    assert result.exit_code == 2
    assert "Error: model source" in result.output and "does not exist" in result.output


def test_compare_cli_gates_exit_non_zero_with_one_line_when_the_evidence_is_missing(
    tiny_model_dir: Path, lora_run: Path, tmp_path: Path
) -> None:
    from rayft.cli.main import cli

    config = tmp_path / "cfg.yaml"
    config.write_text(f"name: cli\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n")
    args = ["compare", str(config), "eval.max_samples=6", "eval.generation.max_new_tokens=4", "eval.runtime=local",
            "--model", f"base={tiny_model_dir}", "--model", f"tuned={lora_run}"]  # fmt: skip
    out = tmp_path / "cmp"
    # Six examples cannot show that either model is better: the gate fails, and the reports are still written.
    failed = CliRunner().invoke(cli, [*args, "--output", str(out), "--gate", "tuned > base"])
    assert failed.exit_code == 2, failed.output
    errors = [line for line in failed.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "Error: gate 'tuned > base' failed, promotion stopped: tuned - base"
    )
    report = json.loads((out / "compare.json").read_text())
    assert [(g["gate"], g["passed"]) for g in report["gates"]] == [("tuned > base", False)]
    test = report["pairs"][0]["tests"]["accuracy_flexible"]
    assert [e["margin"] for e in test["equivalence"]] == [0.02]
    assert set(test["flips"]) == {"right_to_wrong", "wrong_to_right"}
    assert "gate 'tuned > base': FAILED: " in failed.output and "right-to-wrong" in failed.output
    # Both models lie within a whole accuracy point of each other whatever they answer: that gate passes.
    passed = CliRunner().invoke(cli, [*args, "--output", str(tmp_path / "ok"), "--gate", "tuned >= base within 1"])
    assert passed.exit_code == 0, passed.output
    assert "gate 'tuned >= base within 1': passed: " in passed.output
    assert "Gates" in (tmp_path / "ok" / "compare.html").read_text()
