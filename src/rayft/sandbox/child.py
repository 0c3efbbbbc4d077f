"""The sandbox's launcher: run as a script (``python -I child.py spec.json``), never imported by rayft.

It starts with the parent's privileges, closes the child in, then runs the untrusted ``main.py`` of the
scratch directory in this same interpreter. Standard library only: it runs before anything else is
importable, and under ``-S`` when the code needs no site-packages. The steps, in the order the kernel
requires (namespaces and mounts need root; the limits and the uid are set last):

1. ``isolation == "namespaces"`` (the parent is root): new mount, network, PID and IPC namespaces;
   fresh private ``tmpfs`` over ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock`` and ``/root`` (other runs' and the
   host's temporary files and root's credentials are out of sight; what the code writes there vanishes
   with it), the scratch directory bound back in, and the Python installation read-only; a fork, so
   that the code runs as PID 1 of its namespace, whose end ends every process it started, and a fresh
   ``/proc`` that shows only them.
2. Resource limits: address space and data segment, CPU seconds, file size, open files, no core
   dumps, processes.
3. ``uid`` set: the code runs as that unprivileged user (``nobody``), so file permissions refuse its
   writes outside the scratch directory and the process limit binds (root is exempt from it).
4. ``isolation == "rlimits"``: no network namespace, so :mod:`socket` is patched to refuse new sockets
   before the code runs; a guard against accidents, not against code that means harm (``_socket`` or
   ``ctypes`` reach the system call directly).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import resource
import runpy
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
MS_RDONLY, MS_REMOUNT = 1, 32
COVERED = {"/tmp": "1777", "/var/tmp": "1777", "/dev/shm": "1777", "/run/lock": "1777", "/root": "0755"}
"""Directories replaced by an empty private tmpfs: the world-writable ones, and root's home (credentials)."""
EXIT_SETUP = 125  # the launcher could not close the code in: the parent reports it, the code never ran

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                    data.encode() if data else None),
        f"mount {target}",
    )  # fmt: skip


def enter_namespaces(scratch: str, tmp_mb: int, exposed: list[str]) -> None:
    """New namespaces, private temporary directories and a hidden ``/root``; returns in the code's
    process (PID 1). ``exposed``: directories the code needs (the Python installation, ``sys.path``
    entries) bound back read-only where a covered directory hid them."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host
    kept = [(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY)) for path in [scratch, *exposed] if _hidden(path)]
    for path, mode in COVERED.items():
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode={mode}")
    for path, fd in kept:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        if path != scratch:
            _mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    os.chdir(scratch)
    # SIGTERM waits (blocked) until the launcher's handler is in place: a timeout that comes in between
    # still kills PID 1 rather than the launcher alone.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()  # the first child of a new PID namespace is its PID 1
    if pid:
        _wait_and_exit(pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    # A kernel that refuses a fresh /proc: the host's stays visible (read-only to nobody).
    with contextlib.suppress(OSError):
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _hidden(path: str) -> bool:
    """Whether a covered directory holds ``path``."""
    return os.path.isdir(path) and any(path == c or path.startswith(c + "/") for c in COVERED)


def _wait_and_exit(pid: int) -> None:
    """The launcher outside the namespace: wait for its PID 1 and exit as it did (128 + a signal). On
    SIGTERM (the parent's timeout) it kills PID 1 and reaps it, so that no zombie is left to count
    against the uid's process limit."""
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _, status = os.waitpid(pid, 0)
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def _own_processes() -> int:
    """The processes this uid runs now: RLIMIT_NPROC counts them all, not only the sandbox's."""
    uid = os.getuid()
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def set_limits(limits: dict[str, Any], uid: int | None) -> None:
    """The resource limits; the process limit counts the processes the uid already runs."""
    memory = int(limits["memory_mb"]) * 1024 * 1024
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    nproc = int(limits["processes"]) + (0 if uid is not None else _own_processes())
    for name, value in (
        ("RLIMIT_AS", memory), ("RLIMIT_DATA", memory), ("RLIMIT_FSIZE", int(limits["file_mb"]) * 1024 * 1024),
        ("RLIMIT_NOFILE", int(limits["open_files"])), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", nproc),
    ):  # fmt: skip
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later


def drop_privileges(uid: int) -> None:
    """Become ``uid`` for good; then die with the launcher (the setting is cleared by a change of uid)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def refuse_sockets() -> None:
    """Without a network namespace: new sockets raise, for code that goes through :mod:`socket`."""
    import socket

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError("network access is disabled in this sandbox")

    for name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
        setattr(socket, name, refused)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    scratch = spec["scratch"]
    try:
        if spec["isolation"] == "namespaces":
            enter_namespaces(scratch, int(spec["limits"]["file_mb"]), spec["exposed"])
        set_limits(spec["limits"], spec["uid"])
        if spec["uid"] is not None:
            drop_privileges(int(spec["uid"]))
        if spec["isolation"] != "namespaces":
            refuse_sockets()
    except OSError as exc:
        print(f"sandbox setup failed: {exc}", file=sys.stderr)
        os._exit(EXIT_SETUP)
    os.chdir(scratch)
    sys.path[:0] = [scratch, *spec["paths"]]
    sys.argv = ["main.py"]
    runpy.run_path(os.path.join(scratch, "main.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1])
