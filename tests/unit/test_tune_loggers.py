"""A trial's result.json and progress.csv keep every report when Tune pauses and restarts the trial
before the driver has synced them to the sweep's storage (rayft._ray_private.trial_result_loggers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs

from rayft._ray_private import trial_result_loggers


class Storage:
    def __init__(self, stored: Path) -> None:
        self.trial_fs_path = str(stored)
        self.storage_filesystem = pyarrow.fs.LocalFileSystem()


class Trial:
    """What Tune's logger callbacks read of a trial: its config, local (driver) and stored paths,
    and whether it has a checkpoint to restart from."""

    def __init__(self, local: Path, stored: Path) -> None:
        self.config = {"train.learning_rate": 1e-3}
        self.local_path = str(local)
        self.storage = Storage(stored)
        self.checkpoint: object | None = None
        self.init_local_path()

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


def run_paused_trial(logger: Any, tmp_path: Path) -> Trial:
    """Report step 4, pause (the stored copy is synced before the report, as Tune's periodic sync
    may leave it), restart from the checkpoint, report step 8."""
    trial = Trial(tmp_path / "driver" / "t1", tmp_path / "storage" / "t1")
    Path(trial.storage.trial_fs_path).mkdir(parents=True)
    logger.log_trial_start(trial)
    for name in ("result.json", "progress.csv"):  # the last sync ran before the first report
        (Path(trial.storage.trial_fs_path) / name).write_text("", encoding="utf-8")
    logger.log_trial_result(1, trial, {"step": 4, "training_iteration": 1})
    logger.log_trial_end(trial)
    trial.checkpoint = object()
    logger.log_trial_start(trial)
    logger.log_trial_result(2, trial, {"step": 8, "training_iteration": 2})
    logger.log_trial_end(trial)
    return trial


def test_a_paused_and_restarted_trial_keeps_every_report(tmp_path: Path) -> None:
    loggers = trial_result_loggers()
    assert [type(c).__name__ for c in loggers] == ["JsonLogger", "CsvLogger"]
    json_logger, csv_logger = loggers
    trial = run_paused_trial(json_logger, tmp_path)
    rows = [json.loads(line) for line in (Path(trial.local_path) / "result.json").read_text().splitlines()]
    assert [r["step"] for r in rows] == [4, 8]
    trial = run_paused_trial(csv_logger, tmp_path / "csv")
    lines = (Path(trial.local_path) / "progress.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("4,") and lines[2].startswith("8,"), lines


def test_tunes_own_logger_loses_the_reports_made_before_the_pause(tmp_path: Path) -> None:
    # What the loggers above guard against; if this starts failing, Ray fixed it.
    from ray.tune.logger import JsonLoggerCallback

    trial = run_paused_trial(JsonLoggerCallback(), tmp_path)
    rows = [json.loads(line) for line in (Path(trial.local_path) / "result.json").read_text().splitlines()]
    assert [r["step"] for r in rows] == [8]


def test_a_restored_sweep_takes_the_stored_copy(tmp_path: Path) -> None:
    json_logger, _ = trial_result_loggers()
    trial = Trial(tmp_path / "driver" / "t1", tmp_path / "storage" / "t1")
    Path(trial.storage.trial_fs_path).mkdir(parents=True)
    (Path(trial.storage.trial_fs_path) / "result.json").write_text('{"step": 4}\n', encoding="utf-8")
    trial.checkpoint = object()
    json_logger.log_trial_start(trial)
    json_logger.log_trial_result(2, trial, {"step": 8})
    json_logger.log_trial_end(trial)
    steps = [json.loads(line)["step"] for line in (Path(trial.local_path) / "result.json").read_text().splitlines()]
    assert steps == [4, 8]
