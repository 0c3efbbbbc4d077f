"""`rayft run configs/tool-use-sft.yaml` at tiny sizes: calculator traces of large-operand problems from the
symbolic generator, then SFT on them, with the calls and the solutions trained and nothing rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_tool_use_config_runs_sdg_then_sft(ray_session: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    overrides = [f"storage_path={tmp_path / 'runs'}", f"model.name={tiny_model_dir}", "sdg.num_seeds=8",
                 "sdg.variations=2", "train.max_steps=2", "train.save_steps=2", "train.eval_steps=2",
                 "data.max_seq_length=2048", "logging.tensorboard=false"]  # fmt: skip
    args = ["run", str(REPO / "configs" / "tool-use-sft.yaml"), *overrides]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "tool-use-sft"
    traces = [json.loads(line) for line in (run_dir / "sdg" / "data.jsonl").read_text().splitlines()]
    assert traces and all(json.loads(r["messages"])[1]["tool_calls"] for r in traces)
    stats = json.loads((run_dir / "train" / "data" / "stats.json").read_text())
    assert stats["rejected_total"] == 0, stats["rejected_by_reason"]
    assert stats["truncated"] == 0  # the tiny tokenizer's traces fit 2,048 tokens whole
    assert all(f.startswith("messages") for f in stats["formats"].values())
    assert (run_dir / "train" / "final" / "adapter_model.safetensors").is_file()
