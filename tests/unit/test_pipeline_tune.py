"""`rayft run` with a tune section: the train stage trains the best trial's values, or adopts its run."""

from __future__ import annotations

from pathlib import Path

import yaml

from rayft.config import dump_config, load_config
from rayft.pipeline.stages import StageContext, TrainStage, train_stage_config
from rayft.pipeline.tune_stage import adopt_trial_run, plan_train_handoff, sweep_summary, tune_stage_config
from rayft.runs.location import RunLocation
from rayft.runs.manifest import write_manifest
from rayft.runs.records import StageRecord
from rayft.tuning.outputs import write_sweep_outputs
from rayft.tuning.results import SweepResult
from tests.unit.test_tune_results import BASE, sweep


def context(tmp_path: Path, result: SweepResult | None = None) -> StageContext:
    cfg = BASE.model_copy(update={"storage_path": str(tmp_path), "name": "pipe"})
    records = {}
    if result is not None:
        write_sweep_outputs(tmp_path / "tune", result, cfg)
        summary = sweep_summary(result)
        records["tune"] = StageRecord("tune", "f", {}, {"json": "tune/tune.json"}, summary)
    return StageContext(cfg, RunLocation(tmp_path), records)


def test_train_stage_runs_the_best_values_without_the_tune_section(tmp_path: Path) -> None:
    plain, tuned = context(tmp_path / "a"), context(tmp_path / "b", sweep())
    assert tuned.records["tune"].summary["best_params"] == {"train.learning_rate": 3e-4, "lora.r": 8}
    cfg = train_stage_config(tuned)
    assert (cfg.train.learning_rate, cfg.lora.r, cfg.tune, cfg.name) == (3e-4, 8, None, "train")
    assert TrainStage().inputs(plain)["train"]["learning_rate"] == plain.cfg.train.learning_rate
    assert TrainStage().inputs(tuned)["train"]["learning_rate"] == 3e-4
    sweep_cfg = tune_stage_config(plain)
    assert sweep_cfg.tune is not None and sweep_cfg.tune.sweep_name(sweep_cfg.name) == "tune"


def test_finished_best_trial_with_the_same_training_is_adopted(tmp_path: Path) -> None:
    result = sweep()
    trial_dir = tmp_path / "tune" / "trials" / "t2"
    best = result.best
    assert best is not None
    result.trials[result.trials.index(best)] = type(best)(**{**best.__dict__, "run_dir": str(trial_dir)})
    ctx = context(tmp_path, result)
    train_cfg = train_stage_config(ctx)
    trial_cfg = train_cfg.model_copy(
        update={"name": "t2", "train": train_cfg.train.model_copy(update={"save_steps": 2})}
    )
    (trial_dir / "final").mkdir(parents=True)
    (trial_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    (trial_dir / "config.yaml").write_text(dump_config(trial_cfg))
    (trial_dir / "metrics.jsonl").write_text('{"step": 6}\n')
    (trial_dir / "final" / "adapter_model.safetensors").write_bytes(b"weights")
    write_manifest(trial_dir / "final", 6, {"eval/loss": 1.9})
    wanted = yaml.safe_load(dump_config(train_cfg))
    planned = plan_train_handoff(ctx, wanted)
    assert planned is not None
    handoff, source = planned
    assert (handoff.action, source) == ("reuse", trial_dir)
    assert handoff.reason == "trial t2 already trained this config to the end; its final model is reused"
    out = tmp_path / "train"
    adopt_trial_run(trial_dir, out, train_cfg)
    assert (out / "final" / "rayft_checkpoint.json").is_file() and (out / "metrics.jsonl").is_file()
    assert not (out / "checkpoints").exists() and (trial_dir / "checkpoints").is_dir()
    assert load_config(out / "config.yaml") == train_cfg
    assert (out / "final" / "adapter_model.safetensors").stat().st_ino == (
        trial_dir / "final" / "adapter_model.safetensors"
    ).stat().st_ino  # linked, not copied


def test_a_trial_stopped_early_is_trained_again(tmp_path: Path) -> None:
    result = sweep()
    best = result.best
    assert best is not None
    stopped = type(best)(**{**best.__dict__, "status": "STOPPED_EARLY"})
    result.trials[result.trials.index(best)] = stopped
    ctx = context(tmp_path, result)
    planned = plan_train_handoff(ctx, yaml.safe_load(dump_config(train_stage_config(ctx))))
    assert planned is not None and planned[0].action == "train" and "did not train to the end" in planned[0].reason
    assert plan_train_handoff(context(tmp_path / "plain"), {}) is None
