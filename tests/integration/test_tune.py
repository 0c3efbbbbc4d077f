"""``rayft tune`` on the shared local Ray (2 CPUs) with the tiny model: a sweep that cannot fit
fails fast, ASHA over a grid stops a far too high learning rate early and runs every grid point
once, synchronous PBT continues an exploited trial from a copy of the better trial's checkpoint, and Optuna's
TPE with HyperBand ranks trials on an evaluation task's accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import ResourceError
from tests.support.ray_state import actor_classes
from tests.support.runs import adapter_tensors, read_metrics

pytestmark = pytest.mark.integration


def sweep_config(model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    """Trials of one worker, 4 steps, a report (evaluation and checkpoint) every 2 steps."""
    base = [
        f"model.name={model_dir}", f"storage_path={storage}", "name=sw", "scaling.num_workers=1",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 48}]", "data.validation_fraction=0.2",
        "train.micro_batch_size=4", "train.max_steps=4", "train.save_steps=2", "train.eval_steps=2", "lora.r=4",
        "logging.tensorboard=false", "logging.console=false",
    ]  # fmt: skip
    return load_config(None, [*base, *overrides])


def test_a_sweep_that_cannot_fit_the_cluster_fails_fast(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.recipes.tune import run

    cfg = sweep_config(
        tiny_model_dir, tmp_path, "scaling.num_workers=3", "tune.search_space={train.learning_rate: {grid: [1.0e-3]}}"
    )
    before = actor_classes()
    with pytest.raises(ResourceError, match=r"a trial needs .*3 worker\(s\).*lower scaling.num_workers"):
        run(cfg)
    # Fast: refused before Tune started a trial that would wait for resources forever.
    assert {name for _, name in actor_classes() - before} == set()
    assert not (tmp_path / "sw-tune" / "trials").exists()


def test_asha_over_a_grid_stops_the_bad_trial_early_and_runs_each_point_once(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.recipes.tune import run

    # The bad rate (far too high: its first evaluation is worse than the untrained model's, where the
    # good rates' are better) comes last, so it starts once both good trials have reported at the
    # first rung; 12 steps leave it far from its end then.
    cfg = sweep_config(
        tiny_model_dir, tmp_path, "train.max_steps=12", "tune.scheduler=asha", "tune.search_algorithm=grid",
        "tune.grace_period=1", "tune.search_space={train.learning_rate: {grid: [1.0e-2, 3.0e-3, 2.0]}}",
    )  # fmt: skip
    outcome = run(cfg)

    trials = {t.params["train.learning_rate"]: t for t in outcome.result.trials}
    assert sorted(trials) == [3.0e-3, 1.0e-2, 2.0] and len(outcome.result.trials) == 3
    bad = trials[2.0]
    assert bad.status == "STOPPED_EARLY" and len(bad.history) == 1 and bad.steps < 12, bad
    assert "stopped early by asha after 1 report(s)" in bad.stop_reason
    assert any(t.status == "TERMINATED" and t.steps == 12 for t in outcome.result.trials)
    assert outcome.result.best is not None and outcome.result.best.params["train.learning_rate"] != 2.0
    assert not (Path(bad.run_dir) / "final").exists()
    saved = json.loads((outcome.sweep_dir / "tune.json").read_text())
    assert len(saved["trials"]) == 3
    best = load_config(outcome.sweep_dir / "best.yaml")
    assert best.train.learning_rate == outcome.result.best.params["train.learning_rate"]
    assert (outcome.sweep_dir / "tune.html").is_file()


def test_pbt_continues_an_exploited_trial_from_the_better_trials_checkpoint(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.recipes.tune import run

    # Synchronous PBT: both trials meet at their second report (step 4) whichever starts first, and the
    # one trained at the far too low rate copies the other. (Asynchronous PBT ranks a trial against the
    # others' latest reports as it reports: the tiny model trains in well under a second between
    # reports, so a trial that starts a second late may find the other already past its last report.)
    cfg = sweep_config(
        tiny_model_dir, tmp_path, "train.max_steps=6", "checkpoint.num_to_keep=null", "tune.scheduler=pbt",
        "tune.search_algorithm=grid", "tune.search_space={train.learning_rate: {grid: [3.0e-3, 1.0e-6]}}",
        "tune.pbt.perturbation_interval=2", "tune.pbt.synch=true", "tune.pbt.quantile_fraction=0.5",
        "tune.pbt.resample_probability=0",
        "tune.pbt.hyperparam_mutations={train.learning_rate: {choice: [1.0e-3, 2.0e-3, 3.0e-3]}}",
    )  # fmt: skip
    outcome = run(cfg)

    exploited = [t for t in outcome.result.trials if (Path(t.run_dir) / "exploits.jsonl").is_file()]
    assert exploited, [t.stop_reason for t in outcome.result.trials]
    trial = Path(exploited[0].run_dir)
    record = json.loads((trial / "exploits.jsonl").read_text().splitlines()[-1])
    step, source = record["step"], Path(record["source"])
    new_lr = record["params"]["train.learning_rate"]
    # The weights it continued from are the source trial's at the exploit step.
    copied = trial / "checkpoints" / source.name
    mine, theirs = adapter_tensors(copied), adapter_tensors(source)
    assert mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
    # It continued from there (the copied steps are not trained again) to the end, with its new rate.
    donor_dir = source.parent.parent
    donor = {r["step"]: r["train/learning_rate"] for r in read_metrics(donor_dir) if "train/learning_rate" in r}
    after = [r for r in read_metrics(trial) if "train/loss" in r and r["step"] > step]
    assert [r["step"] for r in after] == list(range(step + 1, 7))
    if after:  # the same point of the schedule as the source trial, at the new peak rate
        donor_lr = load_config(donor_dir / "config.yaml").train.learning_rate
        assert after[0]["train/learning_rate"] / new_lr == pytest.approx(donor[step + 1] / donor_lr)
    assert exploited[0].steps == 6 and exploited[0].status == "TERMINATED"
    assert load_config(trial / "config.yaml").train.learning_rate == new_lr


def test_optuna_and_hyperband_rank_trials_on_an_evaluation_task_metric(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("optuna", reason="needs the tune extra: pip install 'rayft[tune]'")
    from ray.tune.search.optuna import OptunaSearch

    from rayft.recipes.tune import run

    # Four trials of two reports each (steps 4 and 8), all running at once (half a CPU per worker), so
    # that Tune adds them together: HyperBand (max_t 2, factor 2) runs the first two to the end in its
    # first bracket and the other two in its second, where it pauses the first to reach one report
    # until the other has reported, then keeps one of them and stops the other after its first report.
    cfg = sweep_config(
        tiny_model_dir, tmp_path, "train.max_steps=8", "train.save_steps=4", "train.eval_steps=4",
        "scaling.resources_per_worker={CPU: 0.5}", "tune.search_algorithm=optuna",
        "tune.scheduler=hyperband", "tune.reduction_factor=2", "tune.num_samples=4", "tune.seed=3",
        "tune.search_space={train.learning_rate: {loguniform: [1.0e-4, 1.0e-2]}, lora.r: {choice: [2, 4]}}",
        "tune.metric=eval_task/accuracy_flexible", "tune.mode=max", "tune.eval_rows=3",
        "eval.datasets=[{path: 'builtin:arithmetic', split: test, max_rows: 8}]", "eval.generation.max_new_tokens=4",
    )  # fmt: skip
    outcome = run(cfg)
    trials = outcome.result.trials
    assert outcome.concurrent == 4 and len(trials) == 4

    # Every value lies in the space and is one Optuna's study proposed.
    study = OptunaSearch()
    study.restore_from_dir(str(outcome.sweep_dir))
    proposed = sorted((t.params["train.learning_rate"], t.params["lora.r"]) for t in study._ot_study.trials)
    assert sorted((t.params["train.learning_rate"], t.params["lora.r"]) for t in trials) == proposed
    assert all(1.0e-4 <= lr <= 1.0e-2 and r in (2, 4) for lr, r in proposed), proposed
    # HyperBand stopped exactly one trial at its second bracket's rung, after one report (training goes
    # on while Tune decides, so its run may have reached its end meanwhile); the others reported twice.
    stopped = [t for t in trials if t.status == "STOPPED_EARLY"]
    assert len(stopped) == 1 and len(stopped[0].history) == 1, [(t.status, t.history) for t in trials]
    assert "stopped early by hyperband after 1 report(s)" in stopped[0].stop_reason
    assert all(len(t.history) == 2 and t.steps == 8 for t in trials if t is not stopped[0])
    # Tune saw each checkpoint once, in order, across the pause and resume of a trial.
    for trial in trials:
        rows = [
            json.loads(line) for line in (outcome.sweep_dir / trial.trial_id / "result.json").read_text().splitlines()
        ]
        assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
        assert [r["step"] for r in rows] == [4, 8][: len(rows)], rows
    # Each report carried the evaluation task's accuracy of the checkpoint it reported, scored on 3 rows.
    for trial in trials:
        scored = [json.loads(line) for line in (Path(trial.run_dir) / "task_scores.jsonl").read_text().splitlines()]
        by_step = {r["step"]: r["scores"]["eval_task/accuracy_flexible"] for r in scored}
        assert all(r["rows"] == 3 for r in scored)
        assert [step for step, _ in trial.history] == sorted(by_step)[: len(trial.history)], (trial.history, scored)
        assert all(by_step[step] == value and 0 <= value <= 1 for step, value in trial.history)
    saved = json.loads((outcome.sweep_dir / "tune.json").read_text())
    assert saved["metric"] == "eval_task/accuracy_flexible" and len(saved["trials"]) == 4
    assert all(t["history"] for t in saved["trials"])
    best = load_config(outcome.sweep_dir / "best.yaml")
    assert best.train.learning_rate == outcome.result.best.params["train.learning_rate"]
    assert "eval_task/accuracy_flexible" in outcome.table
