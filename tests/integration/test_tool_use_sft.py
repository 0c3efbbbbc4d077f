"""`rayft run configs/agent.yaml` at tiny sizes: calculator traces of large-operand problems from the
symbolic generator, SFT on them (the calls and the solutions trained, nothing rejected), multi-turn GRPO in
the calculator's tools environment, the SFT and RL models compared on episodes with the same tool, and the
RL model exported. (configs/tool-use-sft.yaml is the same sdg and train sections without the rest.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# A random model's answers are never right: rewards that tell its completions apart give the RL step a gradient,
# so that export's check of the adapter (a lora_B all zero is refused) sees a trained one.
REWARDS = "rl.rewards=[{function: regex, pattern: '[0-9]'}, {function: length, weight: 0.5}]"


def test_the_shipped_agent_config_runs_sdg_sft_multi_turn_rl_compare_and_export(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    overrides = [f"storage_path={tmp_path / 'runs'}", f"model.name={tiny_model_dir}", "sdg.num_seeds=8",
                 "sdg.variations=2", "train.max_steps=2", "train.save_steps=2", "train.eval_steps=2",
                 "data.max_seq_length=2048", "logging.tensorboard=false", "rl.data.max_seq_length=1024",
                 "rl.train.max_steps=1", "rl.train.save_steps=1", "rl.train.eval_steps=1", "rl.group_size=4",
                 "rl.max_new_tokens=16", REWARDS, "eval.datasets.0.max_rows=4", "eval.generation.max_new_tokens=8",
                 "eval.batch_size=4"]  # fmt: skip
    args = ["run", str(REPO / "configs" / "agent.yaml"), *overrides]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "agent"
    traces = [json.loads(line) for line in (run_dir / "sdg" / "data.jsonl").read_text().splitlines()]
    assert traces and all(json.loads(r["messages"])[1]["tool_calls"] for r in traces)
    stats = json.loads((run_dir / "train" / "data" / "stats.json").read_text())
    assert stats["rejected_total"] == 0, stats["rejected_by_reason"]
    assert stats["truncated"] == 0  # the tiny tokenizer's traces fit 2,048 tokens whole
    assert all(f.startswith("messages") for f in stats["formats"].values())
    assert (run_dir / "train" / "final" / "adapter_model.safetensors").is_file()
    # The RL stage ran episodes in the calculator environment: their figures are in its metrics.
    metrics = [json.loads(line) for line in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "rl/episode/turns" in m]
    assert steps and all(m["rl/episode/turns"] >= 1 for m in steps), metrics
    compare = json.loads(next(run_dir.glob("**/compare.json")).read_text())
    assert "episodes" in json.dumps(compare)
    assert (run_dir / "export" / "config.json").is_file()
