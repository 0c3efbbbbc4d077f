"""The driver of a sweep dies: SIGKILL of ``rayft tune`` once one trial has finished and the next has
saved a checkpoint; the same command again continues the sweep. The finished trial is not run
again, and the interrupted one continues from its checkpoint instead of starting over.

The killed driver is a process of its own; the command run again is the CLI in this process, on
the tests' shared Ray: what it must continue from is what the killed process left, not a fresh
interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.runs.checkpoints import scan_checkpoints
from rayft.runs.layout import MANIFEST_FILE
from tests.chaos.conftest import gcs_address, started_at, wait_for_no_train_workers
from tests.support.ray_state import end_orphaned_cleaners
from tests.support.runs import resumed_after

pytestmark = pytest.mark.chaos

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 6  # of each trial


def tune_command(config: Path) -> list[str]:
    """``rayft tune CONFIG`` on the tests' shared Ray."""
    return [sys.executable, "-m", "rayft", "tune", str(config), "--address", gcs_address()]


def wait_until(process: subprocess.Popen[str], ready: object, timeout_s: float = 240) -> None:
    """Poll ``ready()`` while the driver runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the sweep ended early:\n{process.communicate()[1][-3000:]}"
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the sweep did not get there within {timeout_s} s")


def test_a_killed_sweep_continues_without_rerunning_finished_trials(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text(
        yaml.safe_dump({
            "name": "sw", "storage_path": str(tmp_path / "runs"), "model": {"name": str(tiny_model_dir)},
            "scaling": {"num_workers": 1},
            "data": {"datasets": [{"path": "builtin:arithmetic", "max_rows": 48}], "validation_fraction": 0.2},
            "train": {"micro_batch_size": 4, "max_steps": MAX_STEPS, "save_steps": 2, "eval_steps": 2},
            "lora": {"r": 4}, "logging": {"tensorboard": False},
            "tune": {
                "search_algorithm": "grid", "max_concurrent_trials": 1,
                "search_space": {"train.learning_rate": {"grid": [3.0e-3, 1.0e-3]}},
            },
        })
    )  # fmt: skip
    trials = tmp_path / "runs" / "sw-tune" / "trials"

    def finished() -> list[Path]:
        return sorted(p for p in trials.glob("*") if (p / "final").is_dir()) if trials.is_dir() else []

    def second_has_checkpoint() -> bool:
        started = [p for p in trials.glob("*") if not (p / "final").is_dir()] if finished() else []
        return any(c.complete for p in started for c in scan_checkpoints(p / "checkpoints"))

    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    driver = subprocess.Popen(
        tune_command(config), cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    since = started_at(driver)
    wait_until(driver, second_has_checkpoint)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate()
    # The trial's workers outlive the killed driver for a moment: what they leave (checkpoints, steps)
    # is read once Ray has ended them.
    wait_for_no_train_workers(since)
    ended_at = time.time()
    end_orphaned_cleaners()  # the interrupted trial's
    (done,) = finished()
    before = (done / "final" / MANIFEST_FILE).stat().st_mtime_ns, (done / "metrics.jsonl").read_text()
    (second,) = [p for p in trials.iterdir() if p.is_dir() and p != done]
    saved = max(c.step for c in scan_checkpoints(second / "checkpoints") if c.complete)

    again = CliRunner().invoke(cli, tune_command(config)[3:])  # `rayft tune CONFIG --address GCS`, here
    assert again.exit_code == 0, again.output[-3000:]

    after = (done / "final" / MANIFEST_FILE).stat().st_mtime_ns, (done / "metrics.jsonl").read_text()
    assert after == before  # the finished trial did not train again
    # continued from its last complete checkpoint, not from step 0: each step logged once, those after it anew
    assert saved >= 2
    assert resumed_after(second, ended_at, MAX_STEPS) == saved
    assert (second / "final").is_dir()
    result = json.loads((tmp_path / "runs" / "sw-tune" / "tune.json").read_text())
    assert sorted(t["status"] for t in result["trials"]) == ["TERMINATED", "TERMINATED"]
