"""A process sandbox for code rayft did not write: a model's Python, a model's SQL, a user's tool.

:func:`run_python` runs a program in a child interpreter, bounded in wall and CPU time, memory,
processes, output and file size, and returns a :class:`SandboxResult`; every way the program can fail
(an exception, a limit, a timeout, output past the cap, a setup the kernel refused) comes back as a
result with a one-line :attr:`SandboxResult.error`, never as an exception, and the caller goes on.

What holds the program in, and who enforces it (see docs/guides/environments.md):

- by the kernel, always: ``RLIMIT_AS``/``RLIMIT_DATA`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``,
  ``RLIMIT_NOFILE``, no core dumps; a fresh session whose process group is killed as a whole at the
  wall-clock limit; output read through pipes and cut at ``output_bytes`` (the program is stopped);
- by the kernel, when rayft runs as root (``isolation="namespaces"``, the default there): new network
  (no interface but a down loopback: nothing is reachable), mount, PID and IPC namespaces; private
  ``tmpfs`` over ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock`` and ``/root``; the program runs as
  ``nobody`` as PID 1 of its namespace, so the process limit binds, file permissions refuse writes
  outside the scratch directory, files only root can read stay unread, and every process it started
  ends with it;
- by convention only, without namespaces (``isolation="rlimits"``; without root, or in a container
  that refuses them): the program runs as the calling user (as ``nobody`` when that user is root and
  the Python installation is world-readable), so it can read and write what that user can;
  :mod:`socket` is patched to refuse new sockets, which stops accidents but not code that calls the
  system directly; the process limit counts the user's other processes too, and a child that leaves
  the session outlives the kill.

Files that every user may read (the Python installation, ``/etc``) stay readable in both modes.
Why by hand: the maintained tools that do this (bubblewrap, nsjail, gVisor) are binaries that a Ray
worker's image does not carry; the kernel interfaces they use are reachable from the standard library
(:mod:`resource`, :mod:`subprocess`, ``unshare``/``mount`` through :mod:`ctypes`), which
:mod:`rayft.sandbox.child` applies before the program's first line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)
Isolation = Literal["auto", "namespaces", "rlimits"]
Status = Literal["ok", "error", "timeout", "output_limit", "setup_failed"]
NOBODY = 65534
_CHILD = Path(__file__).with_name("child.py")
_EXIT_SETUP = 125  # rayft.sandbox.child.EXIT_SETUP
_SIGNALS = {signal.SIGXCPU: "the CPU time limit", signal.SIGKILL: "SIGKILL (a limit or the wall-clock timeout)",
            signal.SIGXFSZ: "the file size limit", signal.SIGSEGV: "a segmentation fault"}  # fmt: skip
_READ = 65536
_DRAIN_S = 5.0  # how long a killed run's last processes may take to die before the caller goes on


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole process group is killed (status ``timeout``)."""
    cpu_s: float = 10.0
    """CPU seconds (``RLIMIT_CPU``; rounded up to whole seconds)."""
    memory_mb: int = 1024
    """Address space and data segment, MiB (``RLIMIT_AS``, ``RLIMIT_DATA``): an allocation past it fails."""
    processes: int = 16
    """Processes (``RLIMIT_NPROC``), counted over the uid the program runs as."""
    output_bytes: int = 65536
    """Bytes kept of stdout and of stderr each; past it the program is stopped (status ``output_limit``)."""
    file_mb: int = 16
    """The largest file the program may write, MiB (``RLIMIT_FSIZE``), and the size of its private /tmp."""
    open_files: int = 64
    """Open file descriptors (``RLIMIT_NOFILE``)."""


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended: its status, exit code, (truncated) output and time."""

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: str
    truncated: bool = False
    reason: str = ""

    @property
    def ok(self) -> bool:
        """The program exited 0 within every limit."""
        return self.status == "ok"

    @property
    def error(self) -> str | None:
        """One line saying why the run failed; None when it did not."""
        return None if self.ok else self.reason


@dataclass
class _Output:
    limit: int
    chunks: dict[int, bytearray] = field(default_factory=dict)
    over: bool = False

    def add(self, fd: int, data: bytes) -> None:
        buffer = self.chunks.setdefault(fd, bytearray())
        room = self.limit - len(buffer)
        buffer += data[: max(room, 0)]
        self.over = self.over or len(data) > room

    def text(self, fd: int) -> str:
        return bytes(self.chunks.get(fd, b"")).decode("utf-8", errors="replace")


def resolve_isolation(isolation: Isolation) -> Literal["namespaces", "rlimits"]:
    """``auto``: namespaces where they can be made (root with CAP_SYS_ADMIN: a container without it, such as
    Docker's default, refuses them), else resource limits alone."""
    if isolation != "auto":
        return isolation
    return "namespaces" if os.geteuid() == 0 and sys.platform == "linux" and _namespaces_work() else "rlimits"


@functools.cache
def _namespaces_work() -> bool:
    """Whether this process can set up the namespaces: tried once, with an empty program."""
    probe = run_python("pass", limits=Limits(wall_s=30.0), isolation="namespaces", site_packages=False)
    if probe.status == "setup_failed":
        log.warning("the sandbox runs on resource limits alone: %s (see docs/guides/environments.md)", probe.error)
    return probe.ok


def _run_as(mode: str, paths: tuple[str, ...]) -> int | None:
    """The uid the program runs as: ``nobody`` whenever rayft is root (a program never runs as root), if the
    Python installation and ``paths`` are readable to it: always with namespaces (they expose them), and
    without them when every directory on the way is world-readable (not so for Python under /root)."""
    if os.geteuid() != 0:
        return None
    if mode == "namespaces" or all(_world_readable(Path(p)) for p in _exposed(paths)):
        return NOBODY
    return None


def _world_readable(path: Path) -> bool:
    """Whether every directory from ``/`` down to ``path`` lets others in, and ``path`` lets them read."""
    try:
        modes = [p.stat().st_mode for p in (path, *path.parents)]
    except OSError:
        return False
    return bool(modes[0] & stat.S_IROTH) and all(m & stat.S_IXOTH for m in modes)


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits | None = None,
    isolation: Isolation = "auto",
    site_packages: bool = True,
    paths: tuple[str, ...] = (),
) -> SandboxResult:
    """Run ``source`` as ``main.py`` in a fresh scratch directory (its cwd, HOME and TMPDIR) and return
    how it ended. ``paths``: directories put on the program's ``sys.path`` (read-only to it);
    ``site_packages=False`` starts Python with ``-S``, faster, for programs that need the standard
    library only."""
    limits = limits or Limits()
    mode = resolve_isolation(isolation)
    uid = _run_as(mode, paths)
    scratch = tempfile.mkdtemp(prefix="rayft-sandbox-")
    try:
        spec = _write_scratch(scratch, source, stdin, {"limits": asdict(limits), "isolation": mode, "uid": uid,
                                                       "paths": list(paths), "exposed": _exposed(paths)})  # fmt: skip
        command = [sys.executable, "-I", "-B", *([] if site_packages else ["-S"]), str(_CHILD), spec]
        return _run(command, scratch, limits, mode)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _exposed(paths: tuple[str, ...]) -> list[str]:
    """The directories the program reads: the interpreter's installation, the virtualenv, ``paths``."""
    prefixes = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}
    return sorted({str(Path(p).resolve()) for p in (*prefixes, *paths)})


def _write_scratch(scratch: str, source: str, stdin: str, spec: dict[str, object]) -> str:
    """The program, its input and the launcher's spec; owned by the uid the program runs as."""
    root = Path(scratch)
    (root / "main.py").write_text(source, encoding="utf-8")
    (root / "stdin.txt").write_text(stdin, encoding="utf-8")
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps({**spec, "scratch": scratch}), encoding="utf-8")
    uid = spec["uid"]
    if isinstance(uid, int):
        for path in (root, root / "main.py", root / "stdin.txt"):
            os.chown(path, uid, uid)
        spec_path.chmod(0o600)  # the launcher reads it as root, the program cannot
    return str(spec_path)


def _environment(scratch: str) -> dict[str, str]:
    """A minimal environment: no variable of the caller's (tokens, keys) reaches the program."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8"}  # fmt: skip


def _run(command: list[str], scratch: str, limits: Limits, mode: str) -> SandboxResult:
    started = time.monotonic()
    with open(Path(scratch) / "stdin.txt", "rb") as stdin:
        process = subprocess.Popen(
            command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=scratch,
            env=_environment(scratch), start_new_session=True, close_fds=True,
        )  # fmt: skip
    output = _Output(limits.output_bytes)
    try:
        timed_out = _read_until_done(process, output, started + limits.wall_s)
    finally:
        _kill_group(process, mode)
    wall = time.monotonic() - started
    assert process.stdout is not None and process.stderr is not None
    stdout, stderr = output.text(process.stdout.fileno()), output.text(process.stderr.fileno())
    process.stdout.close()
    process.stderr.close()
    status, reason = _verdict(process.returncode, timed_out, output.over, stderr, limits)
    return SandboxResult(status, process.returncode, stdout, stderr, wall, mode, output.over, reason)


def _read_until_done(process: subprocess.Popen[bytes], output: _Output, deadline: float) -> bool:
    """Read both pipes until they close, the output passes its cap, or the deadline; True on timeout."""
    assert process.stdout is not None and process.stderr is not None
    with selectors.DefaultSelector() as selector:
        for pipe in (process.stdout, process.stderr):
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            for key, _ in selector.select(timeout=remaining):
                data = os.read(key.fd, _READ)
                if not data:
                    selector.unregister(key.fileobj)
                output.add(key.fd, data)
            if output.over:
                return False
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return True
    return False


def _kill_group(process: subprocess.Popen[bytes], mode: str) -> None:
    """Kill the session's whole process group (what the program forked too), reap the launcher, then
    wait (briefly) for the pipes to close: the last holder of a pipe is the last process still dying.
    With namespaces, the launcher is asked first: it kills its PID 1 and reaps it (see the child)."""
    if mode == "namespaces" and process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):  # then killed below with the group
            process.wait(timeout=_DRAIN_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.stdout is not None and process.stderr is not None
    deadline = time.monotonic() + _DRAIN_S
    with selectors.DefaultSelector() as selector:
        for pipe in (process.stdout, process.stderr):
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(deadline - time.monotonic(), 0.0)):
                if not os.read(key.fd, _READ):
                    selector.unregister(key.fileobj)


def _verdict(code: int | None, timed_out: bool, over: bool, stderr: str, limits: Limits) -> tuple[Status, str]:
    if timed_out:
        return "timeout", f"timed out after {limits.wall_s:g} s of wall-clock time"
    if over:
        return "output_limit", f"output passed its limit of {limits.output_bytes} bytes; the program was stopped"
    if code == 0:
        return "ok", ""
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if code == _EXIT_SETUP:
        return "setup_failed", f"the sandbox could not be set up: {last}"
    return "error", _failure(code, last, limits)


def _failure(code: int | None, last: str, limits: Limits) -> str:
    """Why a program that exited non-zero failed: a signal, the memory limit, or its last line of stderr."""
    signum = _signal_of(code)
    if signum is not None:
        return f"killed by {_SIGNALS.get(signum, signum.name)}"
    if "MemoryError" in last:
        return f"MemoryError: over the memory limit of {limits.memory_mb} MiB"
    return f"exit status {code}: {last[:300]}" if last else f"exit status {code}"


def _signal_of(code: int | None) -> signal.Signals | None:
    """The signal that ended the program: a negative code (the launcher itself), or 128 + the signal
    (the launcher's report of its PID 1)."""
    number = -code if code is not None and code < 0 else (code - 128 if code is not None and code > 128 else 0)
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None
