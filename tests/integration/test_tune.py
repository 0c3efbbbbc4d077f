"""``rayft tune`` on the shared local Ray (2 CPUs) with the tiny model: a sweep that cannot fit
fails fast, ASHA over a grid stops a far too high learning rate early and runs every grid point
once, and PBT continues an exploited trial from a copy of the better trial's checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import ResourceError
from tests.helpers import adapter_tensors, read_metrics

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
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"a trial needs .*3 worker\(s\).*lower scaling.num_workers"):
        run(cfg)
    assert time.monotonic() - started < 30
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

    cfg = sweep_config(
        tiny_model_dir, tmp_path, "train.max_steps=6", "checkpoint.num_to_keep=null", "tune.scheduler=pbt",
        "tune.search_algorithm=grid", "tune.search_space={train.learning_rate: {grid: [3.0e-3, 1.0e-6]}}",
        "tune.pbt.perturbation_interval=1", "tune.pbt.quantile_fraction=0.5", "tune.pbt.resample_probability=0",
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
