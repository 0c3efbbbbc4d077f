"""`rayft run` with SFT then pairs sampled from what it trained, at tiny sizes: the pairs stage samples
the train stage's final model, lineage records both steps, and a rerun skips both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.pipeline.fingerprint import hash_file
from rayft.runs.layout import MANIFEST_FILE

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, model_dir: Path, extra: str = "") -> Path:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"""
name: tiny-pairs
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
data:
  datasets:
    - path: "builtin:arithmetic"
      max_rows: 16
      format: template
      input_template: "Question: {{question}}\\nAnswer:"
      output_template: "{{answer}}"
  validation_fraction: 0.0
  max_seq_length: 256
lora: {{r: 4}}
train: {{max_steps: 2, micro_batch_size: 2, learning_rate: 3.0e-3, save_steps: 2}}
scaling: {{num_workers: 1}}
logging: {{tensorboard: false}}
pairs:
  problems: {{path: "builtin:arithmetic", split: test}}
  num_problems: 4
  samples_per_problem: 2
  answer_match: flexible
  generation: {{max_new_tokens: 6, batch_size: 8}}
{extra}"""
    )
    return config


def test_pairs_are_sampled_from_the_sft_model_and_lineage_records_both_steps(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    config = write_config(tmp_path, tiny_model_dir)
    first = CliRunner().invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    run_dir = tmp_path / "runs" / "tiny-pairs"
    final = run_dir / "train" / "final"
    lineage = json.loads((run_dir / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == ["train", "pairs"]
    pairs_step = lineage["stages"][1]
    assert pairs_step["inputs"]["model"] == "stage:train"
    assert pairs_step["inputs"]["sft"] == hash_file(final / MANIFEST_FILE), "pairs name their SFT model"
    summary = json.loads((run_dir / pairs_step["outputs"]["summary_json"]).read_text())
    assert summary["model"] == f"{tiny_model_dir} + LoRA adapter {final}"
    assert summary["problems"] == 4 == summary["problems_with_pairs"] + sum(summary["no_pair"].values())
    assert summary["samples"] == 8
    lines = (run_dir / pairs_step["outputs"]["data_jsonl"]).read_text().splitlines()
    assert len(lines) == summary["pairs"]

    again = CliRunner().invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert "== train: skipped" in again.output and "== pairs: skipped" in again.output
