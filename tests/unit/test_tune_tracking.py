"""A sweep's MLflow run: the parent of its trials' training runs, with the best trial at the end.

MLflow's own file store stands in for a server: the same client calls, without a process to start or
the SQLite store's schema migrations (seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rayft.config import RayftConfig
from rayft.tracking.driver import PARENT_RUN_ENV, nested_under, start_training
from rayft.tuning.tracker import SweepTracker
from tests.unit.test_tune_results import sweep

pytest.importorskip("mlflow", reason="needs the mlflow extra: pip install 'rayft[mlflow]'")


def test_trials_nest_under_the_sweep_run_which_gets_the_best_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # maintained, but no longer MLflow's default
    uri = (tmp_path / "mlruns").as_uri()
    cfg = RayftConfig(
        name="demo",
        logging={"mlflow": {"tracking_uri": uri, "experiment": "sweeps", "artifacts": []}},
        tune={"search_space": {"train.learning_rate": {"loguniform": [1e-5, 1e-2]}}},
    )
    tracker = SweepTracker.start(cfg, tmp_path / "sweep", "demo-tune")
    parent = tracker.parent_run_id
    assert parent is not None
    with nested_under(parent):
        trial = start_training(cfg.model_copy(update={"name": "demo-tune-t1"}), tmp_path / "t1", {})
    assert PARENT_RUN_ENV not in os.environ
    trial.finish(succeeded=True)
    (tmp_path / "sweep" / "tune.json").write_text("{}")
    tracker.finish(sweep(), succeeded=True, files=[tmp_path / "sweep" / "tune.json"])

    client = MlflowClient(tracking_uri=uri)
    child = client.get_run(trial.mlflow.run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent
    done = client.get_run(parent)
    assert done.info.status == "FINISHED" and done.data.tags["rayft.best_trial"] == "t2"
    assert done.data.metrics["best.eval_loss"] == 1.9 and done.data.metrics["trials.stopped_early"] == 1
    assert done.data.params["search_space.train.learning_rate"] == "{'loguniform': [1e-05, 0.01]}"
    assert [a.path for a in client.list_artifacts(parent)] == ["tune.json"]
    again = SweepTracker.start(cfg, tmp_path / "sweep", "demo-tune")  # a resumed sweep continues its run
    assert again.parent_run_id == parent
