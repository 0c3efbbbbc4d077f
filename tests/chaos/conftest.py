"""Fixtures of the chaos tests: prepared units, trial counts, and a subprocess driver on the tests'
shared Ray (started, dated, and waited on until Ray has ended its workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from tests.support.ray_state import train_workers

REPO = Path(__file__).resolve().parents[2]


def chaos_trials(ci: int, full: int) -> int:
    """Trials to run: ``ci`` by default, ``full`` with RAYFT_CHAOS_TRIALS=full, or the number given."""
    value = os.environ.get("RAYFT_CHAOS_TRIALS", "")
    if value == "full":
        return full
    return int(value) if value.isdigit() else ci


def chaos_seed() -> int:
    """Seed of the random kill points (RAYFT_CHAOS_SEED, default 0), printed by each test."""
    return int(os.environ.get("RAYFT_CHAOS_SEED", "0"))


def start_driver(
    prepared: PreparedData, model_dir: Path, storage: Path, *overrides: str, env: Mapping[str, str] | None = None,
    resume: bool = False, address: str | None = None,
) -> subprocess.Popen[str]:  # fmt: skip
    """Start ``tests.chaos.driver`` in a subprocess (stdout and stderr captured as text)."""
    args = [sys.executable, "-m", "tests.chaos.driver", prepared.root, str(model_dir), str(storage), *overrides]
    args += ["--resume"] if resume else []
    args += ["--address", address] if address else []
    return subprocess.Popen(
        args, cwd=REPO, env={**os.environ, **(env or {})}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def run_driver(*args: object, timeout_s: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run the driver to its end (or its death); return its exit code and output."""
    process = start_driver(*args, **kwargs)  # type: ignore[arg-type]
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"driver did not finish within {timeout_s} s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def gcs_address() -> str:
    """The GCS address of this test process's Ray, for a driver that joins it."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def started_at(driver: subprocess.Popen[str]) -> float:
    """When the driver process started (read while it runs: a reaped pid has no start time)."""
    import psutil

    return float(psutil.Process(driver.pid).create_time())


def wait_for_no_train_workers(since: float, timeout_s: float = 90) -> None:
    """Ray ends a dead driver's actors; wait until none of its Ray Train worker processes is left.

    The driver's workers are those of this process's Ray started after it: a Ray Train worker of
    another Ray on the same machine (a run or a test process beside this one) is not this driver's.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not train_workers(since):
            return
        time.sleep(0.5)
    raise AssertionError(f"Ray Train workers still running {timeout_s} s after their driver died")


@pytest.fixture(scope="session")
def prepared(arithmetic_units: PreparedData) -> PreparedData:
    """64 training and 8 validation units of arithmetic problems (sample ids 0..63 for training)."""
    return arithmetic_units
