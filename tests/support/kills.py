"""Killing a Ray Train worker of a run at a chosen step, however fast the machine is."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.ray_state import train_workers
from tests.support.runs import read_metrics


def kill_a_worker_at(
    run_dir: Path, step: int, killed: list[int], monkeypatch: Any, choose: Callable[[list[Any]], Any] = lambda w: w[-1]
) -> threading.Thread:
    """Hold the run that will train in ``run_dir`` before step ``step + 1`` (``RAYFT_FAULT_HOLD``)
    and, once metrics.jsonl shows ``step``, SIGKILL one of its Ray Train workers (``choose``), then
    let the run go on. The kill lands between ``step`` and ``step + 1`` however fast the machine
    is; ``killed`` gets the last step logged before it. Set up before the run starts."""
    release = run_dir.with_name(f"{run_dir.name}.released-{step}")
    monkeypatch.setenv("RAYFT_FAULT_HOLD", f"{step + 1}:{release}")
    since = time.time()

    def watch() -> None:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 900  # a backstop: a run that never gets there is let go, unkilled
        while not release.exists():
            try:
                done = [r["step"] for r in read_metrics(run_dir) if "train/loss" in r] if metrics.exists() else []
            except ValueError:  # a line being written
                done = []
            workers = train_workers(since) if done and max(done) >= step else []
            if workers:
                killed.append(max(done))
                os.kill(choose(workers).pid, signal.SIGKILL)
            if workers or time.monotonic() > deadline:
                release.touch()
            time.sleep(0.05)  # the run is held before the next step: a later look costs only wall time

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
