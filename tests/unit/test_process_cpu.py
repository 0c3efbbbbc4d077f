"""The kinds by which tests.support.process_cpu sums a command's CPU time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process_cpu import main, process_kind

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["ray::RayTrainWorker"], "ray::RayTrainWorker"),
        (["ray::IDLE"], "ray::IDLE"),
        (["ray::MapBatches(run_window_block).submit"], "ray::MapBatches(run_window_block)"),
        (["/v/bin/python", "/v/lib/ray/_private/workers/default_worker.py", "--node-ip-address=1"], "ray::IDLE"),
        (["/v/lib/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"], "raylet"),
        (["/v/lib/ray/core/src/ray/gcs/gcs_server", "--log_dir=x"], "gcs"),
        (["/v/bin/python", "-u", "/v/lib/ray/_private/log_monitor.py"], "log monitor"),
        (["/v/bin/python", "/v/bin/rayft", "train", "c.yaml"], "rayft train"),
        (["/v/bin/python", "/v/bin/pytest", "-q", "tests/x.py"], "pytest"),
        (["/usr/bin/chromium", "--headless"], "chromium"),
        ([], "?"),
    ],
)
def test_a_process_is_named_by_what_it_runs(cmdline: list[str], kind: str) -> None:
    assert process_kind(cmdline) == kind


def test_the_cpu_of_a_child_and_of_the_orphan_it_leaves_is_counted_and_its_exit_status_kept() -> None:
    # The command starts a detached grandchild (as `ray start` leaves its daemons) that spins 0.6 s of CPU
    # after the command exits; both are counted. In a process of its own: it adopts orphans and reaps.
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    leave = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {spin!r}])\nraise SystemExit(3)"
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.process_cpu", "--", sys.executable, "-c", leave],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    found = re.search(r"^wall ([\d.]+) s, CPU ([\d.]+) s, exit 3$", done.stdout, re.M)
    assert found, done.stdout
    assert float(found.group(2)) >= 0.35, done.stdout  # the orphan's spin, less at most one sample


def test_no_command_is_a_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--"]) == 2
    assert "usage: python -m tests.support.process_cpu -- CMD ARGS" in capsys.readouterr().err
