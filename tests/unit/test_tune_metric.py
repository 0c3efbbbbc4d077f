"""What a sweep may rank trials on (the training loop's metrics and the evaluation task's), the
Optuna extra, and what a trial reports when it continues: all decided without Ray."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import ConfigError
from rayft.runs import layout
from rayft.runs.manifest import Manifest
from rayft.tuning.sweep import check_sweep, trial_outcome
from rayft.tuning.task_eval import SCORES_FILE, check_metric, known_metrics, recorded_scores, trial_eval_config
from rayft.tuning.trial import Pointer, unreported_checkpoints

SPACE = "tune.search_space={train.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}}"


def sweep(*overrides: str) -> RayftConfig:
    return load_config(None, [SPACE, *overrides])


def test_each_source_names_the_metrics_it_reports() -> None:
    assert known_metrics(sweep()) == [
        "train/loss", "eval/loss", "eval_task/accuracy_strict", "eval_task/accuracy_flexible",
    ]  # fmt: skip
    sql = known_metrics(sweep("eval.task=sql"))
    assert sql[2:] == ["eval_task/execution_accuracy", "eval_task/exact_match", "eval_task/invalid_sql_rate"]
    assert known_metrics(sweep("eval.task=custom", "eval.metric=json:loads"))[2:] == ["eval_task/*"]
    assert known_metrics(sweep("task.path=my_tasks:Digits")) == ["train/loss", "eval/loss", "eval/*"]


def test_a_metric_some_source_reports_is_accepted() -> None:
    check_metric(sweep())  # eval/loss
    check_metric(sweep("tune.metric=eval_task/accuracy_flexible", "tune.mode=max"))
    check_metric(sweep("eval.task=sql", "tune.metric=eval_task/invalid_sql_rate"))  # lower is better: min fits
    check_metric(sweep("eval.task=custom", "eval.metric=json:loads", "tune.metric=eval_task/f1", "tune.mode=max"))
    check_metric(sweep("task.path=my_tasks:Digits", "tune.metric=eval/accuracy", "tune.mode=max"))


def test_a_metric_no_source_reports_names_the_known_ones_and_the_fix() -> None:
    known = "train/loss, eval/loss, eval_task/accuracy_strict, eval_task/accuracy_flexible"
    guess = r"Did you mean eval_task/accuracy_strict or eval_task/accuracy_flexible\? Set tune.metric"
    with pytest.raises(
        ConfigError, match=rf"tune.metric='accuracy' is reported by no source.* reports {known} .*{guess}"
    ):
        check_metric(sweep("tune.metric=accuracy", "tune.mode=max"))
    with pytest.raises(ConfigError, match=r"'eval_task/execution_accuracy' .*eval.task=gsm8k.*or eval.task to"):
        check_metric(sweep("tune.metric=eval_task/execution_accuracy", "tune.mode=max"))
    with pytest.raises(ConfigError, match=r"custom task's model is not a language model"):
        check_metric(sweep("task.path=my_tasks:Digits", "tune.metric=eval_task/accuracy_flexible", "tune.mode=max"))
    with pytest.raises(ConfigError, match=r"reported by no source"):
        check_metric(sweep("task.path=my_tasks:Digits", "tune.metric=eval/"))


def test_an_accuracy_with_the_default_mode_min_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"eval_task/accuracy_flexible' is better when higher.*set tune.mode=max"):
        check_sweep(sweep("tune.metric=eval_task/accuracy_flexible"))


def test_optuna_missing_is_refused_before_ray_starts_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"needs Optuna, which is not installed: pip install 'rayft\[tune\]'"):
        check_sweep(sweep("tune.search_algorithm=optuna"))
    check_sweep(sweep("tune.search_algorithm=random"))


def test_a_trial_scores_eval_rows_else_eval_max_samples() -> None:
    assert trial_eval_config(sweep("tune.eval_rows=5", "eval.backend=vllm")).max_samples == 5
    ev = trial_eval_config(sweep("eval.max_samples=7"))
    assert (ev.max_samples, ev.backend, ev.runtime) == (7, "hf", "local")


def test_recorded_scores_are_the_last_ones_of_a_step(tmp_path: Path) -> None:
    lines = [{"step": 2, "scores": {"eval_task/a": 0.1}}, {"step": 4, "scores": {"eval_task/a": 0.5}},
             {"step": 2, "scores": {"eval_task/a": 0.25}}]  # fmt: skip
    (tmp_path / SCORES_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert recorded_scores(tmp_path, 2) == {"eval_task/a": 0.25}
    assert recorded_scores(tmp_path, 6) == {} and recorded_scores(tmp_path / "none", 2) == {}


def test_a_continuing_trial_reports_the_checkpoints_tune_has_not_seen(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        directory = tmp_path / layout.CHECKPOINTS_DIR / layout.step_dir_name(step)
        directory.mkdir(parents=True)
        if step != 6:  # step 6 is half-written: no manifest
            (directory / layout.MANIFEST_FILE).write_text(Manifest(step, {}, {"eval/loss": 1.0}).to_json())
    pointer = Pointer(str(tmp_path), layout.step_dir_name(2), 2)
    assert unreported_checkpoints(tmp_path, pointer) == [Pointer(str(tmp_path), layout.step_dir_name(4), 4)]
    assert [p.step for p in unreported_checkpoints(tmp_path, None)] == [2, 4]
    assert unreported_checkpoints(tmp_path, Pointer(str(tmp_path), layout.step_dir_name(4), 4)) == []


def test_a_trial_the_scheduler_stopped_after_its_run_ended_is_stopped_early() -> None:
    tune = sweep("tune.scheduler=hyperband").tune
    assert tune is not None
    assert trial_outcome(tune, True, None, 1, 8, full_reports=2) == (
        "STOPPED_EARLY",
        "stopped early by hyperband after 1 report(s) (training reached its end, step 8, before the stop took effect)",
    )
    assert trial_outcome(tune, True, None, 2, 8, full_reports=2)[0] == "TERMINATED"


def test_run_directories_of_trials_the_sweep_does_not_know_are_found(tmp_path: Path) -> None:
    from rayft.tuning.results import SweepResult, TrialRecord
    from rayft.tuning.sweep import orphan_runs, sweep_place

    cfg = sweep(f"storage_path={tmp_path}", "name=sw")
    assert cfg.tune is not None
    place = sweep_place(cfg, cfg.tune)
    trial = TrialRecord("a1", {}, 1.0, 1.0, 4, "TERMINATED", "", "")
    result = SweepResult("sw-tune", "eval/loss", "min", [trial], "a1")
    assert orphan_runs(place, result) == []
    for name in ("a1", "b2"):
        (tmp_path / "sw-tune" / "trials" / name).mkdir(parents=True)
    assert orphan_runs(place, result) == [tmp_path / "sw-tune" / "trials" / "b2"]


def test_a_trial_that_scores_on_gpus_reserves_them_and_the_plan_counts_them() -> None:
    from rayft.tuning.plan import plan_concurrency
    from rayft.tuning.sweep import trial_driver_resources

    gpu = ["scaling.use_gpu=true", "scaling.num_workers=1", "eval.num_gpus_per_worker=1"]
    assert trial_driver_resources(sweep(*gpu)) == {"memory": 1.0}  # eval/loss: nothing to score
    scoring = sweep(*gpu, "tune.metric=eval_task/accuracy_flexible", "tune.mode=max", "tune.num_samples=8")
    assert trial_driver_resources(scoring) == {"memory": 1.0, "GPU": 1.0}
    plan = plan_concurrency(scoring, {"CPU": 16.0, "GPU": 4.0, "memory": 1e12}, driver=trial_driver_resources(scoring))
    assert plan.concurrent == 2 and plan.per_trial["GPU"] == 2.0, plan.reason
