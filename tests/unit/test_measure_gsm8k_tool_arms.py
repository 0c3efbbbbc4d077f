"""benchmarks/measure_gsm8k_tool_arms.py: the config it derives from configs/agent.yaml and the commands it runs.

The config must validate as rayft reads it, request no sdg stage (``--only train`` would otherwise stop on
the sdg stage's missing output), and give the episodes room for GSM8K's longest solutions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rayft.config import load_config
from rayft.config.checks import requested_stages

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the driver imports the converter by this name, as when run as a script
    spec.loader.exec_module(module)
    return module


_load("gsm8k_tool_traces")
_load("measure_tool_arms")
driver = _load("measure_gsm8k_tool_arms")


def test_the_derived_config_validates_without_sdg_and_fits_gsm8ks_traces(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = driver.write_config(tmp_path, data)
    cfg = load_config(path, [f"storage_path={tmp_path / 'runs'}"])
    assert requested_stages(cfg.model_fields_set) == ["train", "rl", "eval", "export"]  # as `rayft run` plans
    assert [d.path for d in cfg.data.datasets] == [str(data / "train_tools.jsonl")]
    assert cfg.rl is not None and cfg.eval.environment is not None
    # GSM8K's solutions make up to 9 calculator calls: each a model turn, then the final answer
    assert cfg.eval.environment.max_turns >= 10 and cfg.eval.environment.max_tool_calls >= 9
    assert cfg.eval.environment == cfg.rl.environment
    assert cfg.eval.prompt_template == "{question}"
    assert cfg.rl.data == {
        "datasets": [{"path": str(data / "rl_prompts.jsonl"), "format": "messages"}]
    }  # stage overrides


def test_the_stages_are_rayft_commands_on_the_same_problems(tmp_path: Path) -> None:
    args = driver._parser().parse_args([str(tmp_path), "--train-rows", "40", "--sft-steps", "2", "--heldout", "4"])
    stages = {name: command for name, command, _ in driver._stages(args, tmp_path, tmp_path / "gsm8k-agent.yaml")}
    assert list(stages) == ["tools_sft", "tools_rl", "plain_sft", "compare"]
    assert all(command[1:3] == ["-m", "rayft"] for command in stages.values())
    tools_rows = next(a for a in stages["tools_sft"] if a.startswith("data.datasets="))
    plain_rows = next(a for a in stages["plain_sft"] if a.startswith("data.datasets="))
    assert tools_rows.replace("train_tools", "train_plain") == plain_rows and "max_rows: 40" in plain_rows
    assert "eval.without_tools=[base, sft_plain]" in stages["compare"]
    assert "eval.max_samples=4" in stages["compare"]


def test_same_problems_trains_each_arm_one_epoch_instead_of_a_step_budget(tmp_path: Path) -> None:
    config = driver.write_config(tmp_path, tmp_path / "data")
    for flags, expected in (([], 40), (["--same-problems"], None)):
        args = driver._parser().parse_args([str(tmp_path), *flags])
        for name, command, _ in driver._stages(args, tmp_path, config):
            if name.endswith("_sft"):
                overrides = [a for a in command[4:] if "=" in a and not a.startswith("--")]
                assert load_config(config, overrides).train.max_steps == expected
