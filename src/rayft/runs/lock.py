"""A lock on a run directory, so that two drivers never write the same run.

The lock is a file beside the directory, ``<parent>/.<name>.lock`` (beside, not inside, so that a
directory moved aside or a mirror reset keeps it). It is created with ``O_CREAT | O_EXCL``, atomic on
a local filesystem and on shared mounts (NFSv3 and later), and holds JSON: host, pid, command,
start time and a random token. While the driver runs, a daemon thread touches the file every
:data:`HEARTBEAT_S`: its modification time is the holder's heartbeat.

A second driver is refused at once, with the holder's host and pid. A lock is stale, and taken over
with a warning, when its holder is gone:

- on this host, when its pid no longer exists (or is this very process, which does not hold it: a
  restarted container reusing the pid);
- on another host, whose pids cannot be checked, when its heartbeat is older than :data:`LEASE_S`
  (six missed heartbeats). The age is read against this host's clock, so clocks of the hosts
  sharing a mount must agree to well under the lease.

A run at a URI is locked through its local mirror: this protects it from a second driver on the
same machine only (object stores offer pyarrow no create-if-absent to build a shared lock on).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rayft.errors import RunStateError, StorageError

log = logging.getLogger("rayft.runs")

HEARTBEAT_S = 10.0
"""How often the holder touches its lock file."""
LEASE_S = 60.0
"""How long a lock held from another host stays valid without a heartbeat."""
_ATTEMPTS = 3


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run's lock."""

    host: str
    pid: int
    command: str
    started_at: float
    token: str


def lock_path(directory: Path) -> Path:
    """The lock file of a run directory: ``<parent>/.<name>.lock``."""
    return directory.parent / f".{directory.name}.lock"


def stale_reason(
    holder: LockHolder | None,
    heartbeat_age_s: float,
    *,
    host: str,
    pid: int,
    pid_alive: Callable[[int], bool],
    lease_s: float = LEASE_S,
) -> str | None:
    """Why a lock is stale (None: it is held). ``holder`` None is an unreadable lock file.

    Args:
        holder: What the lock file says, or None when it cannot be parsed.
        heartbeat_age_s: Seconds since the lock file was last touched.
        host: This host's name.
        pid: This process's id.
        pid_alive: Whether a process of this host exists.
        lease_s: How long a lock from another host lives without a heartbeat.
    """
    if holder is None:
        return f"unreadable, untouched for {heartbeat_age_s:.0f} s" if heartbeat_age_s > lease_s else None
    if holder.host == host:
        if holder.pid == pid:
            return f"pid {pid} is this process, which does not hold it (a restarted process reusing the pid)"
        return None if pid_alive(holder.pid) else f"pid {holder.pid} no longer exists on {host}"
    if heartbeat_age_s > lease_s:
        return f"no heartbeat from {holder.host} for {heartbeat_age_s:.0f} s (lease {lease_s:.0f} s)"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


class RunLock:
    """The lock of one run directory, held from :meth:`acquire` to :meth:`release`, with a heartbeat."""

    def __init__(
        self, directory: Path, *, command: str, heartbeat_s: float = HEARTBEAT_S, lease_s: float = LEASE_S
    ) -> None:
        self.directory = directory
        self.path = lock_path(directory)
        self.lease_s = lease_s
        self._heartbeat_s = heartbeat_s
        self._me = LockHolder(socket.gethostname(), os.getpid(), command, time.time(), uuid.uuid4().hex)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise RunStateError when another driver holds it."""
        for _ in range(_ATTEMPTS):
            if self._create():
                self._beat = threading.Thread(target=self._heartbeat, name="rayft-run-lock", daemon=True)
                self._beat.start()
                return
            holder, age = self._read(self.path)
            if age is None:
                continue  # released meanwhile
            reason = stale_reason(holder, age, host=self._me.host, pid=self._me.pid, pid_alive=pid_alive,
                                  lease_s=self.lease_s)  # fmt: skip
            if reason is None:
                raise RunStateError(self._held_message(holder, age))
            log.warning("taking over the lock %s of a driver that is gone: %s", self.path, reason)
            self._take_over(holder)
        raise RunStateError(
            f"{self.path}: other drivers keep taking the lock of {self.directory}; start one driver per run"
        )

    def refuse_if_held(self) -> None:
        """Raise RunStateError when a live driver holds the lock now; take nothing."""
        holder, age = self._read(self.path)
        if age is None:
            return
        me = self._me
        if stale_reason(holder, age, host=me.host, pid=me.pid, pid_alive=pid_alive, lease_s=self.lease_s) is None:
            raise RunStateError(self._held_message(holder, age))

    def release(self) -> None:
        """Stop the heartbeat and delete the lock file, if it is still this driver's."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        holder, _ = self._read(self.path)
        if holder is not None and holder.token == self._me.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _create(self) -> bool:
        """Create the lock file with this driver's details; False when it exists."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise StorageError(
                f"storage_path: cannot create the run lock {self.path} ({exc.strerror}); choose a writable "
                "directory with storage_path=..."
            ) from exc
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(self._me)))
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _take_over(self, stale: LockHolder | None) -> None:
        """Move the stale lock file aside; put it back if another driver replaced it meanwhile."""
        aside = self.path.with_name(f"{self.path.name}.stale-{self._me.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another driver took it over first
        moved, _ = self._read(aside)
        if stale is not None and (moved is None or moved.token != stale.token):
            with contextlib.suppress(FileExistsError):  # a fresh lock was moved: restore it, never over a newer one
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            holder, _ = self._read(self.path)
            if holder is None or holder.token != self._me.token:
                log.error("the lock %s is no longer this driver's (taken over by %s)", self.path, holder)
                return
            os.utime(self.path)

    @staticmethod
    def _read(path: Path) -> tuple[LockHolder | None, float | None]:
        """The holder a lock file names (None if unreadable) and its heartbeat age (None if it is gone)."""
        try:
            age = time.time() - path.stat().st_mtime
            raw = json.loads(path.read_text(encoding="utf-8"))
            return LockHolder(**raw), age
        except FileNotFoundError:
            return None, None
        except (ValueError, TypeError):
            return None, age

    def _held_message(self, holder: LockHolder | None, age_s: float) -> str:
        if holder is None:
            return (
                f"run directory {self.directory} is locked ({self.path} is being written or is damaged); retry in a "
                f"minute, or delete {self.path} if no driver uses this run"
            )
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.started_at))
        return (
            f"run directory {self.directory} is in use by `{holder.command}` on host {holder.host}, pid "
            f"{holder.pid} (started {started}, last heartbeat {age_s:.0f} s ago); two drivers writing one run "
            f"would corrupt it. Wait for it to finish, or stop it (kill {holder.pid} on {holder.host}); a lock "
            f"whose driver is gone is taken over automatically ({self.path})"
        )


def refuse_if_held(directory: Path) -> None:
    """Raise the refusal :meth:`RunLock.acquire` would, when a live driver holds ``directory``'s lock.

    For what happens before the lock is taken (opening the run's log file): a second driver must
    not write a line into the first one's run. Taking the lock itself stays the real guard.
    """
    RunLock(directory, command="").refuse_if_held()


@contextmanager
def run_lock(directory: Path, *, command: str) -> Iterator[RunLock]:
    """Hold the lock of ``directory`` for the body (released on exit and on error)."""
    lock = RunLock(directory, command=command)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


@contextmanager
def node_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) among the processes of this machine
    (the ranks of one node that share a directory)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
