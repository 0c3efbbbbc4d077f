"""`rayft run` with export.gate at tiny sizes: a gate the evidence does not support stops the pipeline
before the export stage; one it supports lets the export through, and the model card states it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _write_config(tmp_path: Path, model_dir: Path, gate: str) -> Path:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"""
name: gated
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
data:
  datasets:
    - path: "builtin:arithmetic"
      split: train
      max_rows: 16
      format: template
      input_template: "Question: {{question}}\\nAnswer:"
      output_template: "{{answer}}"
  validation_fraction: 0.0
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 2, micro_batch_size: 2, save_steps: 2}}
scaling: {{num_workers: 1}}
logging: {{tensorboard: false}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 6}}]
  batch_size: 6
  generation: {{max_new_tokens: 4}}
export: {{merge: true, gate: ["{gate}"]}}
"""
    )
    return config


def test_a_failed_gate_stops_the_pipeline_before_export(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    runner = CliRunner()
    # Two training steps of a random model on 6 examples: nothing shows the tuned model is better.
    failed = runner.invoke(cli, ["run", str(_write_config(tmp_path, tiny_model_dir, "tuned > base"))])
    assert failed.exit_code == 2, failed.output
    error = [line for line in failed.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and error[0].startswith("Error: gate 'tuned > base' failed, export stopped: tuned - base ")
    run_dir = tmp_path / "runs" / "gated"
    assert (run_dir / "stages" / "eval.json").is_file()
    assert not (run_dir / "stages" / "export.json").exists()
    assert not (run_dir / "export").exists() and not list(run_dir.glob("export*")), "nothing was exported"
    compare = json.loads((run_dir / "eval" / "compare.json").read_text())
    assert [(g["gate"], g["passed"]) for g in compare["gates"]] == [("tuned > base", False)]

    # A gate the same evidence supports (no model can fall a whole accuracy point behind): the eval
    # stage reruns for the new gate's margin, the export goes through, and its card states the gate.
    passed = runner.invoke(cli, ["run", str(_write_config(tmp_path, tiny_model_dir, "tuned >= base within 1"))])
    assert passed.exit_code == 0, passed.output
    card = (run_dir / "export" / "README.md").read_text()
    assert "## Evidence" in card and "- `tuned >= base within 1`: tuned - base " in card
    record = json.loads((run_dir / "stages" / "export.json").read_text())
    assert record["summary"]["gate.tuned >= base within 1"].startswith("tuned - base ")
