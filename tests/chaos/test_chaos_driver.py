"""The driver dies or is told to stop: SIGKILL of the driver process mid-run, then the same run
with --resume continues from the last committed checkpoint; SIGTERM makes the run save a
checkpoint of the current step and exit 143 with a message, and --resume continues from it.
Both end with the per-step losses of an uninterrupted run. RAYFT_CHAOS_TRIALS=full runs the
driver kill 5 times (CI: 1)."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.runs.checkpoints import scan_checkpoints
from tests.chaos.conftest import (
    chaos_seed,
    chaos_trials,
    gcs_address,
    start_driver,
    started_at,
    wait_for_no_train_workers,
)
from tests.support.ray_state import end_orphaned_cleaners
from tests.support.runs import RESUME_RUN, read_metrics, resumed_after, tiny_config, train_losses, train_on

pytestmark = pytest.mark.chaos

COMMON = RESUME_RUN


@pytest.fixture(scope="module")
def reference(uninterrupted_run: Path) -> dict[int, float]:
    return train_losses(uninterrupted_run)


def wait_for_step(process: subprocess.Popen[str], run_dir: Path, step: int, timeout_s: float = 300) -> int:
    """Block until metrics.jsonl shows ``step`` (return the last step seen)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the driver ended early:\n{process.communicate()[1][-3000:]}"
        if (run_dir / "metrics.jsonl").exists():
            done = [r["step"] for r in read_metrics(run_dir) if "train/loss" in r]
            if done and max(done) >= step:
                return max(done)
        time.sleep(0.01)
    process.kill()
    raise AssertionError(f"step {step} not reached within {timeout_s} s")


def committed_steps(run_dir: Path) -> list[int]:
    return [c.step for c in scan_checkpoints(run_dir / "checkpoints") if c.complete]


def test_killing_the_driver_then_resume_continues_from_the_last_committed_checkpoint(
    tiny_model_dir: Path, prepared: PreparedData, reference: dict[int, float], tmp_path: Path
) -> None:
    rng = random.Random(chaos_seed())
    for trial in range(chaos_trials(ci=1, full=5)):
        kill_step = rng.randint(4, 10)
        what = f"trial {trial} (seed {chaos_seed()}): driver killed after step {kill_step}"
        storage = tmp_path / f"trial-{trial}"
        # Held before the next step (a release that never comes): the kill lands after kill_step
        # however fast the machine is. The resume runs in this process, without the hold.
        hold = {"RAYFT_FAULT_HOLD": f"{kill_step + 1}:{tmp_path / 'never-released'}"}
        driver = start_driver(prepared, tiny_model_dir, storage, *COMMON, address=gcs_address(), env=hold)
        since = started_at(driver)
        wait_for_step(driver, storage / "run", kill_step)
        driver.send_signal(signal.SIGKILL)
        killed_at = time.time()
        driver.communicate()
        wait_for_no_train_workers(since)
        assert end_orphaned_cleaners(), "a run on a Ray it did not start has a placement-group cleaner"
        last = max(committed_steps(storage / "run"), default=0)
        assert last >= 3, what

        run_dir = train_on(tiny_config(tiny_model_dir, storage, *COMMON), prepared, resume=True)
        assert resumed_after(run_dir, killed_at, max(reference)) == last, what
        assert train_losses(run_dir) == reference, what  # bitwise, every step


def test_sigterm_saves_a_checkpoint_of_the_current_step_and_resume_continues_from_it(
    tiny_model_dir: Path, prepared: PreparedData, reference: dict[int, float], tmp_path: Path
) -> None:
    settings = (*COMMON, "train.save_steps=100", "failure.sigterm_grace_s=120")  # no periodic save before step 12
    # Held before step 5 until the workers see the stop request: the signal lands mid-run however fast
    # the machine trains, and the run takes step 5 and saves it.
    hold = {"RAYFT_FAULT_HOLD": f"5:{tmp_path / 'never-released'}"}
    driver = start_driver(prepared, tiny_model_dir, tmp_path, *settings, address=gcs_address(), env=hold)
    since = started_at(driver)
    wait_for_step(driver, tmp_path / "run", 4)
    driver.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, err = driver.communicate(timeout=180)
    ended_at = time.time()

    assert driver.returncode == 143, err[-3000:]
    assert time.monotonic() - started < 120
    saved = committed_steps(tmp_path / "run")
    assert saved == [5], saved  # saved on SIGTERM at the held step, not by the schedule
    assert f"Stopped: stopped on SIGTERM after saving checkpoint {tmp_path / 'run' / 'checkpoints'}" in err
    assert "--resume" in err
    assert not (tmp_path / "run" / "final").exists()
    wait_for_no_train_workers(since)

    run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, *settings), prepared, resume=True)
    assert resumed_after(run_dir, ended_at, max(reference)) == saved[0]
    assert train_losses(run_dir) == reference  # bitwise, every step


def test_sigterm_during_a_step_longer_than_the_grace_stops_the_run_with_the_resume_hint(
    tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    """A step that outlasts failure.sigterm_grace_s (rank 0 hangs before step 5, rank 1 waits for it in the
    all-reduce): the grace timer interrupts the launch while Ray Train's own SIGINT handler is in place,
    and the run still stops with the one paragraph and exit code of a stop, naming the last checkpoint."""
    settings = (*COMMON, "failure.sigterm_grace_s=3")
    driver = start_driver(prepared, tiny_model_dir, tmp_path, *settings, address=gcs_address(),
                          env={"RAYFT_FAULT_HANG": "0:5"})  # fmt: skip
    since = started_at(driver)
    wait_for_step(driver, tmp_path / "run", 4)
    driver.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, err = driver.communicate(timeout=180)

    assert driver.returncode == 143, err[-3000:]
    assert time.monotonic() - started < 60
    assert "Stopped: SIGTERM: the workers did not save within failure.sigterm_grace_s=3 s; the run stopped." in err
    assert f"--resume to continue from checkpoint {tmp_path / 'run' / 'checkpoints' / 'step-000003'} (step 3)" in err
    assert "Traceback" not in err, err[-3000:]
    assert committed_steps(tmp_path / "run") == [3]
    wait_for_no_train_workers(since)
