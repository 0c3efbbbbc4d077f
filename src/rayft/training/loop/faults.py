"""Fault injection and tracing for the reliability tests: the chaos tests set these through
environment variables on the driver, and the driver hands them to every worker in its plan.

``RAYFT_FAULT_KILL_IN_SAVE=STEP:POINT``
    SIGKILL the process at ``POINT`` of the save of step ``STEP`` (points: :data:`SAVE_POINTS`).
``RAYFT_FAULT_HANG=RANK:STEP``
    Rank ``RANK`` sleeps forever before optimizer step ``STEP`` (a stuck collective for the others).
``RAYFT_FAULT_RAISE=RANK:STEP``
    Rank ``RANK`` raises a RuntimeError before optimizer step ``STEP``, on every attempt.
``RAYFT_FAULT_STEP_DELAY_S=SECONDS``
    Every rank sleeps this long before each optimizer step (a slow step, to signal a run mid-way).
``RAYFT_FAULT_HOLD=STEP:PATH``
    Every rank waits before optimizer step ``STEP`` until the file ``PATH`` exists or the rank sees a
    stop request (on every attempt): a test acts on a run at a known step (kills a worker, stops a
    server, stops the run) and then lets it go on, instead of racing the run's speed. A stopped run
    takes that step and saves it, so a short run is stopped mid-way however fast it trains. (On a run
    at a URI only rank 0 watches for the request; the other ranks wait for ``PATH``.)
``RAYFT_FAULT_SLOW_RANK=RANK:SECONDS``
    Rank ``RANK`` alone sleeps this long before each optimizer step (a straggler).
``RAYFT_FAULT_DATA_DELAY_S=SECONDS``
    Every rank sleeps this long in the collation of each micro-batch (a slow data loader).
``RAYFT_SAMPLE_LOG=PATH``
    Every rank appends ``{"step", "rank", "sample_ids"}`` per optimizer step to the JSON-lines PATH
    (appended across restarts, so tests see recomputed steps too).

Nothing here runs unless one of these variables is set.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

SAVE_POINTS = ("model_files", "trainer_files", "before_manifest", "before_commit")
_PREFIX = "RAYFT_FAULT_"
_SAMPLE_LOG = "RAYFT_SAMPLE_LOG"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Faults:
    """Faults to inject into a run (all off by default)."""

    kill_in_save: tuple[int, str] | None = None
    hang: tuple[int, int] | None = None
    raise_at: tuple[int, int] | None = None
    sample_log: str | None = None
    step_delay_s: float = 0.0
    hold: tuple[int, str] | None = None
    slow_rank: tuple[int, float] | None = None
    data_delay_s: float = 0.0

    def kill_if(self, step: int, point: str) -> None:
        """SIGKILL this process if a save fault is set for this step and point."""
        if self.kill_in_save == (step, point):
            os.kill(os.getpid(), signal.SIGKILL)

    def before_step(self, rank: int, step: int, stop_requested: Callable[[], bool] = lambda: False) -> None:
        """Slow down, hang or raise before optimizer step ``step`` (1-based) when asked to; a hold
        also ends when ``stop_requested()`` (the worker's stop watch) says the run is to stop."""
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)
        if self.hold is not None and self.hold[0] == step:
            while not os.path.exists(self.hold[1]) and not stop_requested():
                time.sleep(0.02)
        if self.slow_rank is not None and self.slow_rank[0] == rank:
            time.sleep(self.slow_rank[1])
        if self.hang == (rank, step):
            while True:
                time.sleep(3600)
        if self.raise_at == (rank, step):
            raise RuntimeError(f"injected failure on rank {rank} at step {step} (RAYFT_FAULT_RAISE)")

    def slow_data(self, units: _T) -> _T:
        """``units``, after a sleep when a slow loader is asked for (on the way to their collation)."""
        if self.data_delay_s > 0:
            time.sleep(self.data_delay_s)
        return units

    def log_samples(self, rank: int, step: int, sample_ids: list[int]) -> None:
        """Append the sample ids of this rank's optimizer step to the sample log, if enabled."""
        if self.sample_log is None:
            return
        with open(self.sample_log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, "rank": rank, "sample_ids": sample_ids}) + "\n")


def faults_from_env(environ: Mapping[str, str] | None = None) -> Faults:
    """The faults named by ``RAYFT_FAULT_*`` and ``RAYFT_SAMPLE_LOG`` (none when unset)."""
    env = os.environ if environ is None else environ
    kill = env.get(f"{_PREFIX}KILL_IN_SAVE")
    kill_in_save = None
    if kill:
        step, point = kill.split(":", 1)
        if point not in SAVE_POINTS:
            raise ValueError(f"{_PREFIX}KILL_IN_SAVE={kill!r}: the point must be one of {SAVE_POINTS}")
        kill_in_save = (int(step), point)
    return Faults(
        kill_in_save=kill_in_save,
        hang=_pair(env.get(f"{_PREFIX}HANG")),
        raise_at=_pair(env.get(f"{_PREFIX}RAISE")),
        sample_log=env.get(_SAMPLE_LOG) or None,
        step_delay_s=float(env.get(f"{_PREFIX}STEP_DELAY_S") or 0.0),
        hold=_hold(env.get(f"{_PREFIX}HOLD")),
        slow_rank=_slow_rank(env.get(f"{_PREFIX}SLOW_RANK")),
        data_delay_s=float(env.get(f"{_PREFIX}DATA_DELAY_S") or 0.0),
    )


def _hold(value: str | None) -> tuple[int, str] | None:
    if not value:
        return None
    step, path = value.split(":", 1)
    return int(step), path


def _slow_rank(value: str | None) -> tuple[int, float] | None:
    if not value:
        return None
    rank, seconds = value.split(":", 1)
    return int(rank), float(seconds)


def _pair(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    rank, step = value.split(":", 1)
    return int(rank), int(step)
