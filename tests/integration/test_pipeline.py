"""`rayft run` end to end at tiny sizes: sdg -> train (one Ray Train worker) -> eval (base vs tuned) -> export, then
a rerun that skips every stage, and a changed eval section that reruns eval alone (`rayft run --address`
on a running head: tests/integration/test_ray_jobs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _write_config(tmp_path: Path, model_dir: Path, max_samples: int) -> Path:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"""
name: tiny-pipeline
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
sdg:
  seeds: {{path: "builtin:arithmetic", max_rows: 12}}
  num_seeds: 12
  variations: 2
  decontamination:
    datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 8}}]
    mask_numbers: false
    ngram_words: 13
data:
  datasets:
    - path: "stage:sdg"
      format: template
      input_template: "Question: {{question}}\\nAnswer:"
      output_template: "{{answer}}"
  validation_fraction: 0.0
  max_seq_length: 256
lora: {{r: 4}}
train: {{max_steps: 3, micro_batch_size: 2, learning_rate: 3.0e-3, save_steps: 2}}
scaling: {{num_workers: 1}}
logging: {{tensorboard: false}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 8}}]
  max_samples: {max_samples}
  batch_size: 4
  generation: {{max_new_tokens: 8}}
export: {{merge: true}}
"""
    )
    return config


def test_pipeline_runs_then_skips_then_reruns_what_changed(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    runner = CliRunner()
    first = runner.invoke(cli, ["run", str(_write_config(tmp_path, tiny_model_dir, 6))], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    run_dir = tmp_path / "runs" / "tiny-pipeline"
    for stage in ("sdg", "train", "eval", "export"):
        record = json.loads((run_dir / "stages" / f"{stage}.json").read_text())
        assert record["fingerprint"] and all((run_dir / p).exists() for p in record["outputs"].values())
    assert (run_dir / "train" / "final" / "adapter_model.safetensors").is_file()
    assert (run_dir / "export" / "model.safetensors").is_file()
    log = (run_dir / "logs" / "rayft.log").read_text()
    assert f"to {run_dir / 'export'}\n" in log and "export.partial" not in log, "the log names the export's place"
    compare = json.loads((run_dir / "eval" / "compare.json").read_text())
    assert set(compare["models"]) == {"base", "tuned"} and compare["pairs"][0]["tests"]

    lineage = json.loads((run_dir / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == ["sdg", "train", "eval", "export"]
    assert {"rayft", "ray", "torch", "transformers", "peft"} <= set(lineage["software"])
    train_inputs = lineage["stages"][1]["inputs"]
    sdg_data = run_dir / lineage["stages"][0]["outputs"]["data_jsonl"]
    assert str(sdg_data) in train_inputs["files"], "training's fingerprint covers the synthetic data's content"
    report = (run_dir / "report.html").read_text()
    assert "Base vs fine-tuned" in report and "<polyline" in report and "Synthetic data" in report

    second = runner.invoke(cli, ["run", str(_write_config(tmp_path, tiny_model_dir, 6))], catch_exceptions=False)
    assert second.exit_code == 0, second.output
    for stage in ("sdg", "train", "eval", "export"):
        assert f"== {stage}: skipped (up to date" in second.output

    third = runner.invoke(cli, ["run", str(_write_config(tmp_path, tiny_model_dir, 4))], catch_exceptions=False)
    assert third.exit_code == 0, third.output
    assert "== sdg: skipped" in third.output and "== train: skipped" in third.output
    assert "== eval: running (inputs changed" in third.output and "== export: skipped" in third.output
    compare = json.loads((run_dir / "eval" / "compare.json").read_text())
    assert compare["models"]["base"]["metrics"][compare["primary_metric"]]["n"] == 4
