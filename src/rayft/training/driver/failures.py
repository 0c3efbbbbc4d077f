"""What ended an attempt of a Ray Train run, told in one line, and whether another attempt may fix it.

A launch ends in one of three ways that Ray reports differently:

- a worker process died (SIGKILL, Ray's memory monitor, its node lost): a ``WorkerGroupError``
  whose failure for that rank is a ``RayActorError``;
- a worker raised: a ``WorkerGroupError`` with the exception (a rayft error among its causes is a
  verdict that no retry changes, and is raised as it is);
- Ray Train's controller itself died (Ray's memory monitor picks it as readily as a worker, and Ray
  Train's own ``FailureConfig`` cannot restart it), or the worker group could not start: the
  exception comes out of ``fit()`` itself.

:func:`describe_failure` is pure (it reads exception types and texts), so each case is unit-tested
without a cluster; the launcher decides and prints from what it returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rayft.config.train import FailureConfig
from rayft.errors import RayftError, exception_chain, first_line

Cause = Literal["memory", "killed", "node", "error", "start"]

MEMORY_ADVICE = (
    "To use less memory: lower train.micro_batch_size (raising train.gradient_accumulation_steps keeps the batch), "
    "run fewer scaling.num_workers per node, prefer train.method=lora, or free the node of other processes; Ray "
    "kills workers above RAY_memory_usage_threshold of the node's memory (0.95 by default)."
)

_MEMORY_USED = re.compile(r"Memory on the node \(IP: ([^,\s]+)[^)]*\) was ([\d.]+\s*GB) used / ([\d.]+\s*GB) limit")
_MEMORY_THRESHOLD = re.compile(r"threshold of \d+B \(([\d.]+)% of")
_MEMORY_FRACTION = re.compile(r"limit \((0\.\d+|1\.0+)\)")
_IP = re.compile(r"\bip: ([0-9a-fA-F.:]+)")


@dataclass(frozen=True)
class Failure:
    """One failed attempt: ``what`` happened (a clause: "worker 1 was killed by ..."), on which
    ``node`` (an IP, when Ray says), its ``cause``, whether a restart may help, and for a raised
    error the one-line message the run ends with (``message``) or the rayft error to re-raise."""

    what: str
    cause: Cause
    retryable: bool
    node: str | None = None
    message: str = ""
    rayft_error: RayftError | None = None

    @property
    def lost_worker(self) -> bool:
        """Whether a process of the run died (killed, out of memory, node lost) rather than raised."""
        return self.cause in ("memory", "killed", "node")


def describe_failure(exc: BaseException, config: FailureConfig) -> Failure | None:
    """What ``exc``, raised by Ray Train's ``fit()``, says happened; None for what is no failure
    of the run's processes (an interrupt, an error of the driver's own)."""
    from ray.exceptions import RayActorError
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(exc, WorkerGroupError):
        return worker_group_failure(exc.worker_failures, config)
    if isinstance(exc, ControllerError):
        return Failure(f"the worker group could not start ({first_line(exc.controller_failure)})", "start", True)
    if isinstance(exc, RayActorError) or _is_out_of_memory(exc):
        return process_failure("the Ray Train controller", exc)
    return None


def worker_group_failure(failures: Mapping[int, BaseException], config: FailureConfig) -> Failure:
    """The failure of a worker group, from each failed rank's error: a rayft error a worker raised
    first, then a worker that died (the others' errors follow from it: a collective cut short),
    then the lowest rank's raised error."""
    for _, error in sorted(failures.items()):
        rayft_error = next((e for e in exception_chain(error) if isinstance(e, RayftError)), None)
        if rayft_error is not None:
            return Failure(str(rayft_error), "error", False, rayft_error=rayft_error)
    for rank, error in sorted(failures.items()):
        died = _died(error)
        if died is not None:
            return process_failure(f"worker {rank}", died)
    rank, error = min(failures.items())
    return Failure(
        f"worker {rank} raised {type(error).__name__}",
        "error",
        True,
        message=describe_worker_failure(rank, error, config),
    )


def process_failure(who: str, error: BaseException) -> Failure:
    """A process of the run that died: by Ray's memory monitor, with its node, or killed."""
    text = str(error)
    ip = _IP.search(text)
    if _is_out_of_memory(error) or _MEMORY_USED.search(text) or "low on memory" in text:
        used = _MEMORY_USED.search(text)
        node = used.group(1) if used else ip.group(1) if ip else None
        return Failure(f"{who} was killed by Ray's memory monitor: {memory_summary(text)}", "memory", True, node)
    node = ip.group(1) if ip else None
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()) and "its node" in text.lower():
        return Failure(f"{who} was lost with its node", "node", True, node)
    if getattr(error, "preempted", False):
        return Failure(f"{who} was lost: its node was preempted", "node", True, node)
    return Failure(f"{who} died (killed by a signal, or the process crashed)", "killed", True, node)


def memory_summary(text: str) -> str:
    """``node memory 95% (22.4GB of 23.5GB) > threshold 90%`` from Ray's out-of-memory report."""
    used, threshold, fraction = _MEMORY_USED.search(text), _MEMORY_THRESHOLD.search(text), _MEMORY_FRACTION.search(text)
    if used is None:
        return "the node ran low on memory"
    share = f"{float(fraction.group(1)) * 100:.0f}% " if fraction else ""
    above = f" > threshold {float(threshold.group(1)):g}%" if threshold else " above Ray's threshold"
    return f"node memory {share}({used.group(2)} of {used.group(3)}){above}"


def describe_worker_failure(rank: int, failure: BaseException, config: FailureConfig) -> str:
    """The one-line message of a run that failed on ``rank`` after the allowed retries."""
    lines = [line.strip() for line in str(failure).strip().splitlines() if line.strip()]
    last_line = lines[-1] if lines else ""
    detail = next((line for line in lines if "Error:" in line and "Traceback" not in line), last_line)
    retries = f"after {config.max_failures} restart(s) (failure.max_failures={config.max_failures})"
    if "timed out" in str(failure).lower() or "timeout" in str(failure).lower():
        return (
            f"a collective timed out on rank {rank} {retries}: another worker is stuck or dead and did not join "
            f"within failure.collective_timeout_s={config.collective_timeout_s:g} s. {type(failure).__name__}: "
            f"{detail}"
        )
    return f"training failed on rank {rank} {retries}: {type(failure).__name__}: {detail}"


def restart_line(
    failure: Failure, *, step: int | None, resume_step: int | None, attempt: int, max_failures: int
) -> str:
    """The line printed before restart ``attempt`` (1-based) of ``max_failures``."""
    where = f" on node {failure.node}" if failure.node else ""
    at = f" after step {step}" if step is not None else " before the first step"
    start = f"checkpoint step {resume_step}" if resume_step is not None else "the start (no checkpoint yet)"
    return f"{failure.what}{where}{at}; restarting the workers from {start} (attempt {attempt} of {max_failures})"


def exhausted_text(failure: Failure, *, step: int | None, restarts: int, max_failures: int) -> str:
    """The first sentence of a run's end after its last allowed restart."""
    where = f" on node {failure.node}" if failure.node else ""
    at = f" after step {step}" if step is not None else " before the first step"
    tried = "no restart allowed" if max_failures == 0 else f"after {restarts} restart(s)"
    return f"{_capitalised(failure.what)}{where}{at}, {tried} (failure.max_failures={max_failures})."


def _died(error: BaseException) -> BaseException | None:
    """The ``RayActorError`` (or out-of-memory error) of a worker that died, if ``error`` is one."""
    from ray.exceptions import RayActorError

    for outer in exception_chain(error):
        inner = getattr(outer, "health_check_failure", None) or outer
        if isinstance(inner, RayActorError) or _is_out_of_memory(inner):
            return inner
    return None


def _is_out_of_memory(error: BaseException) -> bool:
    from ray.exceptions import OutOfMemoryError

    return isinstance(error, OutOfMemoryError)


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]
