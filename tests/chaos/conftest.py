"""Fixtures of the chaos tests: prepared units, trial counts, and a subprocess driver."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData

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


@pytest.fixture(scope="session")
def prepared(arithmetic_units: PreparedData) -> PreparedData:
    """64 training and 8 validation units of arithmetic problems (sample ids 0..63 for training)."""
    return arithmetic_units
