"""benchmarks/measure_rl_budget.py and measure_distillation.py: the commands they run validate as rayft reads
them, an arm's model is its last checkpoint committed within the budget, and the figures count what its steps
sampled (dynamic sampling's extra rounds included)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rayft.config import RayftConfig, load_config

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the drivers import measure_tool_arms by this name, as when run as scripts
    spec.loader.exec_module(module)
    return module


_load("measure_tool_arms")
budget = _load("measure_rl_budget")
distillation = _load("measure_distillation")


def _args(tmp_path: Path, *flags: str) -> argparse.Namespace:
    args: argparse.Namespace = budget._parser().parse_args([str(tmp_path), *flags])
    args.arms = args.arms.split(",")
    args.config = budget.CONFIGS[args.task]
    args.prompts = args.prompts or {"sql": 4, "gsm8k": 2}[args.task]
    return args


def _config(command: list[str]) -> RayftConfig:
    """What rayft reads from ``python -m rayft train CONFIG OVERRIDES...``."""
    assert command[1:4] == ["-m", "rayft", "train"]
    return load_config(command[4], command[5:])


def test_each_sql_arm_is_the_configs_grpo_on_one_worker_saving_every_step(tmp_path: Path) -> None:
    args = _args(tmp_path)
    plain, dynamic = (_config(budget._arm_command(args, tmp_path, tmp_path / "start", arm)) for arm in args.arms)
    for cfg in (plain, dynamic):
        assert cfg.train.objective == "grpo" and cfg.scaling.num_workers == 1 and cfg.train.save_steps == 1
        assert cfg.model.name == str(tmp_path / "start") and cfg.checkpoint.num_to_keep is None
        assert cfg.data.validation_fraction == 0  # no validation at every checkpoint
        assert cfg.train.micro_batch_size == 4 and cfg.train.rl.group_size == budget.GROUP_SIZE
    assert plain.train.rl.dynamic_sampling is None and plain.train.rl.curriculum is None
    assert dynamic.train.rl.dynamic_sampling is not None and dynamic.train.rl.dynamic_sampling.max_rounds == 4
    # the arms differ in their names and dynamic sampling alone
    same, other = plain.model_dump(exclude={"name"}), dynamic.model_dump(exclude={"name"})
    other["train"]["rl"]["dynamic_sampling"] = None
    assert same == other


def test_gsm8k_is_split_as_the_configs_header_says_and_the_curriculum_skips_the_held_out_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n" for i in range(1800)))
    monkeypatch.setattr(budget, "GSM8K", source)
    args = _args(tmp_path, "--task", "gsm8k", "--arms", "plain,dynamic,curriculum", "--heldout", "50")
    sft = budget._data(args, tmp_path, "sft")[0].split("=", 1)[1]
    rl = budget._data(args, tmp_path, "rl")[0].split("=", 1)[1]
    heldout = budget._data(args, tmp_path, "compare")[0].split("=", 1)[1]
    rows = {name: Path(path).read_text().splitlines() for name, path in (("sft", sft), ("rl", rl), ("held", heldout))}
    assert [len(rows[k]) for k in ("sft", "rl", "held")] == [1000, 600, 50]
    assert rows["sft"][0].startswith('{"question": "q0"') and rows["held"][-1].startswith('{"question": "q1799"')
    assert not set(rows["sft"]) & set(rows["rl"]) and not (set(rows["sft"]) | set(rows["rl"])) & set(rows["held"])
    curriculum = _config(budget._arm_command(args, tmp_path, tmp_path / "start", "curriculum"))
    assert curriculum.train.rl.curriculum is not None and curriculum.train.rl.dynamic_sampling is not None
    assert [d.path for d in curriculum.train.rl.curriculum.decontamination.datasets] == [heldout]
    assert [d.path for d in curriculum.data.datasets] == [rl] and curriculum.train.micro_batch_size == 2


def test_an_arms_model_is_its_last_checkpoint_committed_before_the_deadline(tmp_path: Path) -> None:
    for step, committed in ((1, 100.0), (2, 200.0), (3, 300.0)):  # step 3: the save SIGTERM asked for, too late
        marker = tmp_path / "checkpoints" / f"step-{step:06d}" / "rayft_checkpoint.json"
        marker.parent.mkdir(parents=True)
        marker.write_text("{}")
        os.utime(marker, (committed, committed))
    (tmp_path / "checkpoints" / "step-000004").mkdir()  # begun, never committed
    assert budget._checkpoint_before(tmp_path, 250.0) == (tmp_path / "checkpoints" / "step-000002", 2)
    with pytest.raises(SystemExit, match="no checkpoint committed within the budget"):
        budget._checkpoint_before(tmp_path, 50.0)


def test_the_figures_count_every_completion_a_step_sampled(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "rl/reward": 0.5, "rl/zero_std_groups": 0.5, "time/step": 10.0, "rl/groups_drawn": 4.0,
         "rl/groups_trained": 2.0, "rl/extra_rollouts": 0.0},
        {"step": 2, "rl/reward": 1.0, "rl/zero_std_groups": 1.0, "time/step": 30.0, "rl/groups_drawn": 8.0,
         "rl/groups_trained": 0.0, "rl/extra_rollouts": 32.0},  # every group alike, even after a refill
        {"step": 2, "eval/loss": 0.1},
        {"step": 3, "rl/reward": 0.0, "rl/zero_std_groups": 0.0, "time/step": 5.0},  # after the model's checkpoint
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = budget._figures(tmp_path, 2, budget_s=1800.0, first_round=32)
    assert figures["steps"] == 2 and figures["steps_with_gradient"] == 1 and figures["share_with_gradient"] == 0.5
    assert figures["completions"] == 32 + 64 and figures["mean_reward"] == round((16 + 64) / 96, 4)
    assert figures["reward_per_hour"] == 160.0 and figures["mean_step_s"] == 20.0
    assert figures["groups_drawn"] == 12 and figures["groups_trained"] == 2 and figures["extra_rollouts"] == 32


def test_the_distillation_run_trains_on_the_teacher_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = distillation._parser().parse_args([str(tmp_path), "--teacher", str(tmp_path / "teacher")])
    commands: list[list[str]] = []
    monkeypatch.setattr(distillation, "run_stage", lambda name, command, done, log: commands.append(command))
    distillation._distill(args, tmp_path, {})
    cfg = _config(commands[0])
    assert cfg.train.rl.rewards == [] and cfg.train.rl.distillation is not None
    assert (
        cfg.train.rl.distillation.teacher == str(tmp_path / "teacher") and cfg.train.rl.distillation.mode == "replace"
    )
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.train.max_steps == 30 and cfg.train.eval_steps == 10
