"""Fault injection for the reliability tests, as loop callbacks (``train.callbacks``) that only the
tests register: the training loop calls them on every worker, in every attempt.

:class:`FaultInjector` takes its faults as options, or, given none, from the environment of the
worker process (a run started by a ``rayft`` subprocess, or on a Ray head started with them):

``RAYFT_FAULT_KILL_IN_SAVE=STEP:POINT`` (``kill_in_save``)
    SIGKILL the process at ``POINT`` of the save of step ``STEP`` (points: ``SAVE_STAGES``).
``RAYFT_FAULT_HANG=RANK:STEP`` (``hang``)
    Rank ``RANK`` sleeps forever before optimizer step ``STEP`` (a stuck collective for the others).
``RAYFT_FAULT_RAISE=RANK:STEP`` (``raise_at``)
    Rank ``RANK`` raises a RuntimeError before optimizer step ``STEP``, on every attempt.
``RAYFT_FAULT_STEP_DELAY_S=SECONDS`` (``step_delay_s``)
    Every rank sleeps this long before each optimizer step (a slow step, to signal a run mid-way).
``RAYFT_FAULT_HOLD=STEP:PATH`` (``hold``)
    Every rank waits before optimizer step ``STEP`` until the file ``PATH`` exists or the rank sees a
    stop request (on every attempt): a test acts on a run at a known step (kills a worker, stops a
    server, stops the run) and then lets it go on, instead of racing the run's speed. A stopped run
    takes that step and saves it, so a short run is stopped mid-way however fast it trains. (On a run
    at a URI only rank 0 watches for the request; the other ranks wait for ``PATH``.)
``RAYFT_FAULT_SLOW_RANK=RANK:SECONDS`` (``slow_rank``)
    Rank ``RANK`` alone sleeps this long before each optimizer step (a straggler).
``RAYFT_FAULT_DATA_DELAY_S=SECONDS`` (``data_delay_s``)
    Every rank sleeps this long before the collation of each micro-batch (a slow data loader).
``RAYFT_SAMPLE_LOG=PATH`` (``sample_log``)
    Every rank appends ``{"step", "rank", "sample_ids"}`` per optimizer step to the JSON-lines PATH
    (appended across restarts, so tests see recomputed steps too).

:func:`fault_callbacks` turns the variables set in the test process into the ``train.callbacks``
entry that carries them (:func:`tests.support.runs.tiny_config` adds it), since the workers of the
tests' shared Ray do not see the test's environment. :class:`AllocateUntilKilled` makes a worker
really run out of memory, for Ray's memory monitor to kill.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayft.training.loop.callbacks import SAVE_STAGES, StepInfo

FAULT_INJECTOR = "tests.support.faults:FaultInjector"
ENV_FAULTS = f"train.callbacks=[{FAULT_INJECTOR}]"
"""The override that registers :class:`FaultInjector` with the faults of the workers' environment."""
ALLOCATE_UNTIL_KILLED = "tests.support.faults:AllocateUntilKilled"

# option name -> environment variable
VARIABLES = {
    "kill_in_save": "RAYFT_FAULT_KILL_IN_SAVE",
    "hang": "RAYFT_FAULT_HANG",
    "raise_at": "RAYFT_FAULT_RAISE",
    "step_delay_s": "RAYFT_FAULT_STEP_DELAY_S",
    "hold": "RAYFT_FAULT_HOLD",
    "slow_rank": "RAYFT_FAULT_SLOW_RANK",
    "data_delay_s": "RAYFT_FAULT_DATA_DELAY_S",
    "sample_log": "RAYFT_SAMPLE_LOG",
}


def fault_options(environ: Mapping[str, str]) -> dict[str, str]:
    """The faults named by the variables set in ``environ``, as :class:`FaultInjector` options."""
    return {option: environ[name] for option, name in VARIABLES.items() if environ.get(name)}


def fault_callbacks(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The ``train.callbacks`` entries that inject the faults set in ``environ`` ([] for none)."""
    options = fault_options(environ)
    return [{"target": FAULT_INJECTOR, "options": options}] if options else []


class FaultInjector:
    """Slows down, holds, hangs, raises or kills as its options (or the worker's environment) say."""

    def __init__(self, **options: str) -> None:
        values = options or fault_options(os.environ)
        unknown = set(values) - set(VARIABLES)
        if unknown:
            raise TypeError(f"unknown fault options {sorted(unknown)}; known: {sorted(VARIABLES)}")
        self.kill_in_save = _pair(values.get("kill_in_save"), str)
        if self.kill_in_save is not None and self.kill_in_save[1] not in SAVE_STAGES:
            raise ValueError(f"kill_in_save={values['kill_in_save']!r}: the point must be one of {SAVE_STAGES}")
        self.hang = _pair(values.get("hang"), int)
        self.raise_at = _pair(values.get("raise_at"), int)
        self.hold = _pair(values.get("hold"), str)
        self.slow_rank = _pair(values.get("slow_rank"), float)
        self.step_delay_s = float(values.get("step_delay_s") or 0.0)
        self.data_delay_s = float(values.get("data_delay_s") or 0.0)
        self.sample_log = values.get("sample_log") or None

    def on_save_stage(self, step: int, stage: str) -> None:
        """SIGKILL this process at the save stage asked for."""
        if self.kill_in_save == (step, stage):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_step_begin(self, info: StepInfo) -> None:
        """Slow down, hold, hang or raise before the step when asked to; then log its samples."""
        rank, step = info.rank, info.step
        if self.step_delay_s > 0:
            time.sleep(self.step_delay_s)
        if self.hold is not None and int(self.hold[0]) == step:
            while not os.path.exists(self.hold[1]) and not info.stop_requested():
                time.sleep(0.02)
        if self.slow_rank is not None and int(self.slow_rank[0]) == rank:
            time.sleep(self.slow_rank[1])
        if self.hang == (rank, step):
            while True:
                time.sleep(3600)
        if self.raise_at == (rank, step):
            raise RuntimeError(f"injected failure on rank {rank} at step {step} (RAYFT_FAULT_RAISE)")
        if self.sample_log is not None:
            with open(self.sample_log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": step, "rank": rank, "sample_ids": info.sample_ids}) + "\n")

    def on_micro_batch(self, info: StepInfo) -> None:
        """Sleep before each micro-batch's collation when a slow loader is asked for."""
        if self.data_delay_s > 0:
            time.sleep(self.data_delay_s)


class AllocateUntilKilled:
    """Before step ``step``, rank ``rank`` allocates (and touches) memory in ``chunk_mb`` pieces until
    Ray's memory monitor kills a process of the run, once: the first attempt creates ``marker``,
    and an attempt that finds it trains normally. Allocating ``limit_mb`` without being killed is
    an error (the node's threshold was not reached)."""

    def __init__(self, *, rank: int, step: int, marker: str, chunk_mb: int = 64, limit_mb: int = 6144) -> None:
        self.rank, self.step, self.marker = rank, step, Path(marker)
        self.chunk_mb, self.limit_mb = chunk_mb, limit_mb

    def on_step_begin(self, info: StepInfo) -> None:
        """Allocate until killed, on the first attempt that reaches the step."""
        if info.rank != self.rank or info.step != self.step or self.marker.exists():
            return
        self.marker.write_text(str(os.getpid()))
        held: list[bytearray] = []
        while len(held) * self.chunk_mb < self.limit_mb:
            chunk = bytearray(self.chunk_mb * 2**20)
            chunk[::4096] = b"\1" * len(range(0, len(chunk), 4096))  # touch every page: resident, not reserved
            held.append(chunk)
            time.sleep(0.02)  # leave the monitor (every refresh_ms) time to look
        raise RuntimeError(f"allocated {self.limit_mb} MB on rank {self.rank} and Ray's memory monitor killed nothing")


def _pair(value: str | None, kind: type) -> tuple[Any, Any] | None:
    if not value:
        return None
    first, second = str(value).split(":", 1)
    return int(first), kind(second)
