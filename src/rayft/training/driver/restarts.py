"""After a failed attempt of a Ray Train run: restart it, or end the run with what happened.

The decision reads the failure (:func:`rayft.training.driver.failures.describe_failure`) and the
run's store (the last step logged, the checkpoint a restart resumes from). A restart is one
warning line on the console; Ray's own report of the failure (its tracebacks, the memory
monitor's list of processes) goes to the run's log file only.
"""

from __future__ import annotations

import json
import logging

from rayft.config.train import FailureConfig
from rayft.console import FILE_ONLY
from rayft.errors import TrainingError, WorkersLostError
from rayft.runs import layout
from rayft.runs.store import RunStore
from rayft.training.driver.failures import (
    MEMORY_ADVICE,
    Failure,
    describe_failure,
    exhausted_text,
    restart_line,
)

log = logging.getLogger("rayft.train")


def decide_after_failure(exc: Exception, config: FailureConfig, store: RunStore, *, restarts: int) -> None:
    """Return when the run is to be attempted again (after ``restarts`` restarts so far, one line
    printed); otherwise raise the run's error: a rayft error a worker raised as it is,
    :class:`WorkersLostError` when its processes died too often, :class:`TrainingError` for an error
    that repeated, and ``exc`` itself for what is no failure of the run's processes."""
    failure = describe_failure(exc, config)
    if failure is None:
        raise exc
    log.info("attempt %d of the run failed: %s", restarts + 1, failure.what, exc_info=exc, extra=FILE_ONLY)
    if failure.rayft_error is not None:
        raise failure.rayft_error from None
    step, resume_step = last_logged_step(store), last_checkpoint_step(store)
    if not failure.retryable or restarts >= config.max_failures:
        raise final_error(failure, config, step=step, resume_step=resume_step, restarts=restarts) from None
    line = restart_line(
        failure, step=step, resume_step=resume_step, attempt=restarts + 1, max_failures=config.max_failures
    )
    log.warning("%s", line)


def final_error(
    failure: Failure, config: FailureConfig, *, step: int | None, resume_step: int | None, restarts: int
) -> TrainingError:
    """The error a run ends with after its last allowed attempt."""
    if not (failure.lost_worker or failure.cause == "start"):
        return TrainingError(failure.message or failure.what)
    summary = exhausted_text(failure, step=step, restarts=restarts, max_failures=config.max_failures)
    return WorkersLostError(
        summary, checkpoint_step=resume_step, advice=MEMORY_ADVICE if failure.cause == "memory" else ""
    )


def last_logged_step(store: RunStore) -> int | None:
    """The last training step in the run's metrics.jsonl on this machine (None before the first)."""
    path = store.local_dir / layout.METRICS_FILE
    steps = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line being written
            continue
        if "train/loss" in record:
            steps.append(int(record["step"]))
    return max(steps, default=None)


def last_checkpoint_step(store: RunStore) -> int | None:
    """The step of the newest complete checkpoint, which a restart or ``--resume`` continues from."""
    return max((c.step for c in store.checkpoints() if c.complete), default=None)
