"""Sending metrics to a tracker off the training thread: a bounded queue and one sender thread.

The training loop only puts records on the queue (never blocks: a full queue drops the record and
counts it); the thread sends them in batches, at most one request per ``min_interval_s`` (a request
per step would cost a short step as much CPU as the step itself on a small machine), retrying with
exponential backoff while the tracker is unreachable. Whatever could not be sent when the run ends is
reported (it stays in metrics.jsonl).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("rayft.tracking")

Record = tuple[int, float, dict[str, float]]  # (step, unix time, metrics)


class MetricSink(Protocol):
    """A tracker's side of the sender: connect once (in the sender thread), then send batches."""

    name: str

    def connect(self) -> dict[str, int]:
        """Open the tracker's run; return the highest step it already holds of each metric."""
        ...

    def send(self, records: Sequence[Record]) -> None:
        """Send the records (raises when the tracker is unreachable)."""
        ...

    def close(self) -> None:
        """Finish the tracker's run."""
        ...


@dataclass
class SenderReport:
    """What a sender did: records sent, skipped as already held by the tracker, and not sent."""

    tracker: str
    sent: int = 0
    skipped: int = 0
    unsent_steps: list[int] = field(default_factory=list)
    last_error: str | None = None

    def describe(self) -> str:
        """One line for the end-of-run log."""
        if not self.unsent_steps:
            return f"{self.tracker}: {self.sent} metric records sent"
        steps = self.unsent_steps
        return (
            f"{self.tracker}: {len(steps)} metric records (steps {min(steps)}-{max(steps)}) could not be sent "
            f"({self.last_error}); they are in metrics.jsonl"
        )


def backoff_delays(first_s: float, max_s: float) -> Callable[[int], float]:
    """The wait before retry ``n`` (0-based): ``first_s`` doubled each time, at most ``max_s``."""
    return lambda n: min(first_s * 2**n, max_s)


class BackgroundSender:
    """Sends records to ``sink`` from a daemon thread; :meth:`log` never blocks the caller."""

    def __init__(
        self, sink: MetricSink, *, capacity: int = 10_000, batch: int = 200, retry_first_s: float = 0.5,
        retry_max_s: float = 10.0, min_interval_s: float = 1.0,
    ) -> None:  # fmt: skip
        self._sink = sink
        self._queue: queue.Queue[Record | None] = queue.Queue(maxsize=capacity)
        self._batch = batch
        self._delay = backoff_delays(retry_first_s, retry_max_s)
        self._held: dict[str, int] = {}
        self._pending: list[Record] = []
        self._min_interval_s = min_interval_s
        self._stop = threading.Event()
        self._closing = threading.Event()  # close() was called: send what is queued without waiting
        self._failing = False  # the last attempt failed: an outage is going on
        self.report = SenderReport(sink.name)
        self._thread = threading.Thread(target=self._run, name=f"rayft-{sink.name}-sender", daemon=True)
        self._thread.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Queue one record; a full queue (a long outage) drops it and counts it as unsent."""
        try:
            self._queue.put_nowait((step, time.time(), dict(metrics)))
        except queue.Full:
            self.report.unsent_steps.append(step)

    def close(self, timeout_s: float = 30.0, outage_timeout_s: float = 3.0) -> SenderReport:
        """Send what is queued (for up to ``timeout_s``, or ``outage_timeout_s`` while the tracker is
        unreachable), finish the tracker's run, and report."""
        self._closing.set()
        with contextlib.suppress(queue.Full):  # a long outage: the thread is retrying, it gets the deadline below
            self._queue.put_nowait(None)
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(min(outage_timeout_s, timeout_s) if self._failing else 0.1)
            if self._failing:
                break
        self._stop.set()
        self._thread.join(5.0)
        leftover = [r[0] for r in self._pending]
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                leftover.append(item[0])
        self.report.unsent_steps = sorted(self.report.unsent_steps + leftover)
        self._pending = []
        if self.report.unsent_steps:
            log.warning("%s", self.report.describe())
        return self.report

    def _run(self) -> None:
        if not self._retry(self._connect):
            return
        finished = False
        while not finished and not self._stop.is_set():
            finished = self._fill()
            if self._pending and not self._retry(self._flush):
                return
            if not finished:
                self._closing.wait(self._min_interval_s)  # let records gather into the next batch
        if not self._stop.is_set():
            self._retry(self._sink.close)

    def _connect(self) -> None:
        self._held = self._sink.connect()

    def _fill(self) -> bool:
        """Move queued records into the pending batch; True once the end marker was taken."""
        item = self._queue.get()
        while True:
            if item is None:
                return True
            step, at, metrics = item
            new = {k: v for k, v in metrics.items() if step > self._held.get(k, -1)}
            if new:
                self._pending.append((step, at, new))
            if len(new) < len(metrics):
                self.report.skipped += 1
            if len(self._pending) >= self._batch:
                return False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False

    def _flush(self) -> None:
        self._sink.send(self._pending)
        self.report.sent += len(self._pending)
        self._pending = []

    def _retry(self, action: Callable[[], None]) -> bool:
        """Run ``action`` until it succeeds (True) or the sender is stopped (False)."""
        attempt = 0
        while not self._stop.is_set():
            try:
                action()
                self._failing = False
                return True
            except Exception as exc:
                self._failing = True  # an unreachable tracker: any client error
                self.report.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                if attempt == 0:
                    log.warning(
                        "%s unreachable, retrying in the background: %s", self._sink.name, self.report.last_error
                    )
                self._stop.wait(self._delay(attempt))
                attempt += 1
        return False
