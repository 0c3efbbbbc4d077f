"""The Ray Core tutorial scripts run end to end at a small size, each on its own local Ray (2 CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ray_core"


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "RAY_ADDRESS": ""}  # the script starts its own Ray, never joins the test session's
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_tasks_example_prints_results_and_both_timings() -> None:
    out = _run("tasks.py", "4", "--delay", "0.1", "--num-cpus", "2")
    assert "results:  [0, 1, 4, 9]" in out
    assert "serial:   " in out
    assert "parallel: " in out


def test_actors_example_counts_in_the_class_and_the_actor() -> None:
    out = _run("actors.py", "5", "--num-cpus", "2")
    assert "plain counter: 5" in out
    assert "actor counter: 5 (each call saw [1, 2, 3, 4, 5])" in out
    assert "after two tasks added 5 each: 15" in out
