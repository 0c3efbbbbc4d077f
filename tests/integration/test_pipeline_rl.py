"""`rayft run` with SFT then GRPO at tiny sizes: the rl stage starts from the merged SFT model, trains on
the data's prompts, eval compares SFT with GRPO with the paired test, export takes the GRPO model, and a
rerun skips every stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.pipeline.fingerprint import hash_file
from rayft.runs.layout import MANIFEST_FILE

pytestmark = pytest.mark.integration


def test_sft_then_grpo_then_eval_compares_the_two(ray_session: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    config = tmp_path / "pipeline.yaml"
    config.write_text(f"""
name: tiny-rl
storage_path: {tmp_path / "runs"}
model: {{name: {tiny_model_dir}}}
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
rl:
  group_size: 2
  max_new_tokens: 6
  rewards: [{{function: regex, pattern: "[0-9]"}}]
  train: {{max_steps: 2}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 4}}]
  batch_size: 4
  generation: {{max_new_tokens: 4}}
export: {{merge: true}}
""")
    result = CliRunner().invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "tiny-rl"
    lineage = json.loads((run_dir / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == ["train", "rl", "eval", "export"]
    rl = lineage["stages"][1]
    assert rl["outputs"]["start"] == "sft-merged" and (run_dir / "sft-merged" / "config.json").is_file()
    assert rl["inputs"]["sft"] == hash_file(run_dir / "train/final" / MANIFEST_FILE)
    records = [json.loads(line) for line in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "rl/reward" in r] == [1, 2]
    compared = json.loads((run_dir / "eval" / "compare.json").read_text())
    assert set(compared["models"]) == {"sft", "grpo"}
    assert compared["models"]["grpo"]["source"] == str(run_dir / "rl" / "final")
    assert (compared["pairs"][0]["a"], compared["pairs"][0]["b"]) == ("sft", "grpo")
    export = lineage["stages"][3]
    assert export["inputs"]["tuned"] == hash_file(run_dir / "rl/final" / MANIFEST_FILE)  # the GRPO model exported
    assert (run_dir / "export" / "config.json").is_file()
    report = (run_dir / "report.html").read_text()
    assert "Reinforcement learning (GRPO)" in report and "pass@1" in report

    again = CliRunner().invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert "== train: skipped" in again.output and "== rl: skipped" in again.output
