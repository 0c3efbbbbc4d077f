"""Asking a run's workers to save a checkpoint and stop (on SIGTERM), wherever they run.

The request is written where the run lives: a file in the run directory (a local directory, or
one every node mounts) and, when ``storage_path`` is a URI, a marker object under the run's URI,
so that workers on other nodes see it without sharing a disk with the driver. A worker checks the
file after every step; the URI is polled by a thread of rank 0 (one request a second), and every
rank agrees on the step to stop at (:func:`rayft.training.loop.worker.stop_requested`).

It lives here, with the run's storage, because where the request is written (a directory, a URI)
is the store's business, not the training loop's.
"""

from __future__ import annotations

import logging
import threading

from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.remote import RemoteRun

log = logging.getLogger("rayft.train")

POLL_S = 1.0
"""How often rank 0 looks for the marker under a remote run's URI."""


class StopRequest:
    """The driver's side: send or clear the stop request of the run at ``location``."""

    def __init__(self, location: RunLocation) -> None:
        self.file = location.local_dir / layout.STOP_REQUEST_FILE
        self._remote = RemoteRun(location.remote_uri) if location.remote_uri else None

    def clear(self) -> None:
        """Remove a request (a leftover of an earlier stop would stop the run at its first step)."""
        self.file.unlink(missing_ok=True)
        if self._remote is not None:
            try:
                self._remote.delete(layout.STOP_REQUEST_FILE)
            except OSError as exc:
                log.warning("could not remove the stop request at %s: %s", self._remote.where, exc)

    def send(self) -> None:
        """Write the request: the file at once; the marker under the URI in a thread of its own (an
        upload does not belong in a signal handler), which a slow store cannot hold up."""
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text("SIGTERM\n", encoding="utf-8")
        if self._remote is not None:
            threading.Thread(target=self._send_remote, name="rayft-stop-request", daemon=True).start()

    def _send_remote(self) -> None:
        assert self._remote is not None
        try:
            self._remote.write_text(layout.STOP_REQUEST_FILE, "SIGTERM\n")
        except OSError as exc:
            log.warning("could not write the stop request to %s: %s", self._remote.where, exc)


class StopWatch:
    """A worker's side: whether a stop was requested, from the file in ``location.local_dir`` or
    (for a run at a URI, when ``poll``) from the marker a thread polls for every ``poll_s`` seconds."""

    def __init__(self, location: RunLocation, *, poll: bool = True, poll_s: float = POLL_S) -> None:
        self.file = location.local_dir / layout.STOP_REQUEST_FILE
        self._seen = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if location.remote_uri and poll:
            remote = RemoteRun(location.remote_uri)
            self._thread = threading.Thread(
                target=self._poll, args=(remote, poll_s), name="rayft-stop-watch", daemon=True
            )
            self._thread.start()

    def requested(self) -> bool:
        """Whether a stop was requested (never blocks)."""
        return self._seen.is_set() or self.file.exists()

    def close(self) -> None:
        """Stop polling."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _poll(self, remote: RemoteRun, poll_s: float) -> None:
        while not self._closed.wait(poll_s):
            try:
                if remote.is_file(layout.STOP_REQUEST_FILE):
                    log.info("a stop was requested at %s", remote.where)
                    self._seen.set()
                    return
            except OSError as exc:  # an outage of the store: look again at the next poll
                log.debug("could not look for a stop request at %s: %s", remote.where, exc)
