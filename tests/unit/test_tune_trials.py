"""The pure parts of running a sweep: how a trial starts, what PBT may change when a trial continues
from another's checkpoint, the trial's config, and what each trial became."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rayft.config import dump_config, load_config
from rayft.errors import ConfigError
from rayft.runs.planner import RunState, check_retunable, plan_train_start
from rayft.tuning.sweep import check_sweep, error_line, evaluations_per_run, trial_outcome
from rayft.tuning.trial import Pointer, TrialSetup, adopt_checkpoint, plan_trial_start, read_pointer, trial_config

SPACE = "tune.search_space={train.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}}"


def test_a_trial_starts_resumes_or_adopts_another_trials_checkpoint(tmp_path: Path) -> None:
    mine, other = tmp_path / "a", tmp_path / "b"
    assert plan_trial_start(mine, None, finished=False, exists=False) == "start"
    assert plan_trial_start(mine, None, finished=False, exists=True) == "resume"
    assert plan_trial_start(mine, Pointer(str(mine), "step-000002", 2), finished=False, exists=True) == "resume"
    assert plan_trial_start(mine, Pointer(str(other), "step-000002", 2), finished=False, exists=True) == "adopt"


def test_continuing_with_new_optimiser_settings_is_a_narrow_path() -> None:
    saved = yaml.safe_load(dump_config(load_config(None, ["train.learning_rate=1e-3"])))
    retuned = yaml.safe_load(dump_config(load_config(None, ["train.learning_rate=2e-3", "train.weight_decay=0.1"])))
    state = RunState(exists=True, finished=False, steps=(4,))
    with pytest.raises(ConfigError, match=r"train.learning_rate: 0.001 -> 0.002"):
        plan_train_start("d", "r", state, saved, retuned, resume=True)
    assert plan_train_start("d", "r", state, saved, retuned, resume=True, retune=True).action == "resume"
    reshaped = yaml.safe_load(dump_config(load_config(None, ["train.learning_rate=2e-3", "lora.r=4"])))
    with pytest.raises(ConfigError, match=r"lora.r: 16 -> 4"):
        plan_train_start("d", "r", state, saved, reshaped, resume=True, retune=True)


def test_pbt_refuses_to_perturb_what_shapes_the_model_before_anything_starts() -> None:
    check_retunable(("train.learning_rate", "train.weight_decay"))
    cfg = load_config(
        None, ["scaling.num_workers=1", "tune.scheduler=pbt", "tune.search_space={lora.r: {choice: [8, 16]}}"]
    )
    with pytest.raises(ConfigError, match=r"tune.pbt: lora.r cannot be perturbed.*train.learning_rate"):
        check_sweep(cfg)


def test_pbt_on_a_uri_is_refused_with_the_uri_masked() -> None:
    cfg = load_config(
        None,
        ["scaling.num_workers=1", "tune.scheduler=pbt", "storage_path=s3://bucket/runs?secret_key=s3cr3t-v4lue", SPACE],
    )
    with pytest.raises(
        ConfigError, match=r"storage_path='s3://bucket/runs/rayft-run-tune\?secret_key=\*+REDACTED\*+': scheduler pbt"
    ) as exc:
        check_sweep(cfg)
    assert "s3cr3t" not in str(exc.value)


def test_a_sweep_needs_a_tune_section_and_ray_train_workers() -> None:
    with pytest.raises(ConfigError, match=r"no tune section; add one"):
        check_sweep(load_config(None, []))
    with pytest.raises(ConfigError, match=r"scaling.num_workers=0: each trial trains on Ray Train workers"):
        check_sweep(load_config(None, ["scaling.num_workers=0", SPACE]))


def test_a_trials_config_has_its_values_its_place_and_a_checkpoint_at_every_evaluation() -> None:
    base = load_config(None, ["train.save_steps=10", "train.eval_steps=5", SPACE])
    cfg = trial_config(TrialSetup(base, "/sweeps/s/trials", own_ray=True), {"train.learning_rate": 3e-4}, "t_0001")
    assert (cfg.name, cfg.storage_path, cfg.train.learning_rate) == ("t_0001", "/sweeps/s/trials", 3e-4)
    assert cfg.train.save_steps == 5
    assert evaluations_per_run(base, 12) == 3  # steps 5, 10 and the last one


def test_adopting_a_checkpoint_copies_it_and_the_sources_config_under_this_trials_name(tmp_path: Path) -> None:
    source_run, run = tmp_path / "trials" / "a", tmp_path / "trials" / "b"
    checkpoint = source_run / "checkpoints" / "step-000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"weights")
    (source_run / "config.yaml").write_text(dump_config(load_config(None, ["name=a", "lora.r=4"])))
    (run / "checkpoints" / "step-000006").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(None, ["name=b", "lora.r=8"])))

    used = adopt_checkpoint(Pointer(str(source_run), "step-000004", 4), run, {"train.learning_rate": 1e-3}, "b")

    assert used.step == 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000004"]
    assert not (run / "final").exists()
    assert (run / "checkpoints" / "step-000004" / "adapter_model.safetensors").read_bytes() == b"weights"
    saved = load_config(run / "config.yaml")
    assert (saved.name, saved.lora.r) == ("b", 4)
    record = json.loads((run / "exploits.jsonl").read_text())
    assert record == {"step": 4, "source": str(checkpoint), "params": {"train.learning_rate": 1e-3}}


def test_a_pointer_round_trips(tmp_path: Path) -> None:
    from rayft.tuning.trial import write_pointer

    write_pointer(tmp_path, Pointer("/runs/t", "step-000002", 2))
    assert read_pointer(tmp_path) == Pointer("/runs/t", "step-000002", 2)
    assert read_pointer(tmp_path).path == Path("/runs/t/checkpoints/step-000002")


def test_a_trial_finished_stopped_early_or_failed() -> None:
    tune = load_config(None, ["tune.scheduler=asha", SPACE]).tune
    assert tune is not None
    assert trial_outcome(tune, False, None, 1, 2) == (
        "STOPPED_EARLY",
        "stopped early by asha after 1 report(s), at step 2",
    )
    assert trial_outcome(tune, True, None, 2, 4) == ("TERMINATED", "finished: trained all 4 steps")
    error = RuntimeError("ray::ImplicitFunc.train()\nTraceback (most recent call last):\n  x\nValueError: bad lr")
    assert trial_outcome(tune, True, error, 0, 0) == ("ERROR", "error: ValueError: bad lr")
    assert error_line(RuntimeError("")) == "RuntimeError"


def test_restored_optimizer_takes_the_new_rate_at_the_current_point_of_the_schedule() -> None:
    import torch

    from rayft.config.train import TrainConfig
    from rayft.training.loop.worker import apply_optimizer_settings, build_optimizer, build_scheduler

    net = torch.nn.Linear(4, 4)
    old = TrainConfig(learning_rate=1e-3, warmup_steps=2, weight_decay=0.0)
    optimizer = build_optimizer(net, old)
    scheduler = build_scheduler(optimizer, old, 10)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    saved = (optimizer.state_dict(), scheduler.state_dict())
    new = TrainConfig(learning_rate=2e-3, warmup_steps=2, weight_decay=0.1)
    optimizer = build_optimizer(net, new)
    scheduler = build_scheduler(optimizer, new, 10)
    optimizer.load_state_dict(saved[0])
    scheduler.load_state_dict(saved[1])
    before = optimizer.param_groups[0]["lr"]
    apply_optimizer_settings(optimizer, scheduler, new)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2 * before)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and optimizer.param_groups[1]["weight_decay"] == 0.0
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(2e-3 * scheduler.lr_lambdas[0](5))


def test_a_sweep_continues_only_with_its_own_config(tmp_path: Path) -> None:
    from rayft.tuning.sweep import check_saved_sweep, save_sweep_config, sweep_place

    cfg = load_config(None, [f"storage_path={tmp_path}", "name=s", SPACE])
    assert cfg.tune is not None
    place = sweep_place(cfg, cfg.tune)
    save_sweep_config(place, dump_config(cfg))
    check_saved_sweep(
        place, dump_config(load_config(None, [f"storage_path={tmp_path}", "name=s", SPACE, "scaling.num_workers=1"]))
    )
    other = load_config(None, [f"storage_path={tmp_path}", "name=s", SPACE, "train.max_steps=5"])
    with pytest.raises(
        ConfigError, match=r"sweep 's-tune' .* another config \(train.max_steps: None -> 5\).*tune.name"
    ):
        check_saved_sweep(place, dump_config(other))
