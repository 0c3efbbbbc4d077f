"""`rayft run` with SFT then pairs sampled from what it trained, at tiny sizes: the pairs stage samples
the train stage's final model, lineage records both steps, and a rerun skips both; then DPO on the
pairs, tracked in a real ``mlflow server``, whose run's final model is the DPO one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_dpo_trains_from_the_merged_sft_model_on_the_pairs_and_eval_compares_the_two(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import yaml
    from click.testing import CliRunner

    from rayft.cli.main import cli
    from tests.support.openai_server import OpenAIServer

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is twice {n}?", "answer": f"#### {2 * n}"}) + "\n"
                                for n in range(3, 9)))  # fmt: skip
    calls: dict[str, int] = {}

    def mixed(request: dict[str, Any]) -> str:  # right on odd attempts, wrong on even ones
        question = request["messages"][-1]["content"]
        calls[question] = calls.get(question, 0) + 1
        n = int(question.split("twice ")[1].split("?")[0])
        answer = 2 * n if calls[question] % 2 else 2 * n + 1
        return f"Attempt {calls[question]}: {answer}\n#### {answer}"

    from mlflow.tracking import MlflowClient

    from tests.support.servers import mlflow_server

    with OpenAIServer(responder=mixed) as server, mlflow_server(tmp_path / "mlflow") as tracking:
        extra = f"""  backend: openai
preference:
  objective: dpo
  train: {{max_steps: 2, learning_rate: 1.0e-3}}
eval:
  datasets: [{{path: "{problems}"}}]
  max_samples: 3
  batch_size: 4
  generation: {{max_new_tokens: 4}}
"""
        config = write_config(tmp_path, tiny_model_dir, extra=extra)
        text = config.read_text().replace(
            'problems: {path: "builtin:arithmetic", split: test}', f"problems: {{path: {problems}}}"
        )
        text = text.replace(
            "generation: {max_new_tokens: 6, batch_size: 8}\n",
            f"generation:\n    endpoint: {{base_url: '{server.base_url}'}}\n  ",
        )
        text = text.replace(
            "logging: {tensorboard: false}",
            f"logging: {{tensorboard: false, mlflow: {{tracking_uri: '{tracking.uri}', artifacts: [final]}}}}",
        )
        config.write_text(text)
        result = CliRunner().invoke(cli, ["run", str(config)], catch_exceptions=False)
        # The run's final model is the last one trained: DPO's adapter, not the SFT one it started from.
        client = MlflowClient(tracking_uri=tracking.uri)
        run_id = json.loads((tmp_path / "runs" / "tiny-pairs" / "tracking.json").read_text())["mlflow"]["run_id"]
        logged = Path(client.download_artifacts(run_id, "final/rayft_config.yaml", str(tmp_path / "logged")))
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "tiny-pairs"
    lineage = json.loads((run_dir / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]] == ["train", "pairs", "preference", "eval"]
    pairs, preference = lineage["stages"][1], lineage["stages"][2]
    assert json.loads((run_dir / pairs["outputs"]["summary_json"]).read_text())["pairs"] == 4  # num_problems: 4
    assert preference["outputs"]["start"] == "sft-merged" and (run_dir / "sft-merged" / "config.json").is_file()
    assert preference["inputs"]["sft"] == pairs["inputs"]["sft"] == hash_file(run_dir / "train/final" / MANIFEST_FILE)
    final = run_dir / preference["outputs"]["final"]
    saved = yaml.safe_load((final / "rayft_config.yaml").read_text())
    assert saved["model"]["name"] == str(run_dir / "sft-merged") and saved["train"]["objective"] == "dpo"
    assert saved["data"]["packing"] is False and (final / "adapter_model.safetensors").is_file()
    metrics = [json.loads(line) for line in (run_dir / "preference" / "metrics.jsonl").read_text().splitlines()]
    assert any("rewards/accuracies" in row for row in metrics)
    compare = json.loads((run_dir / "eval" / "compare.json").read_text())
    assert set(compare["models"]) == {"sft", "dpo"}
    assert logged.read_text() == (final / "rayft_config.yaml").read_text()
