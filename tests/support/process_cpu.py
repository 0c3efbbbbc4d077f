"""Where a command's CPU time goes, by kind of process: ``python -m tests.support.process_cpu -- CMD ARGS``.

The integration and chaos tiers are CPU-bound on two cores (docs/development.md), so what a test costs is
the CPU time of every process it makes run, not its wall time: its pytest process, the ``rayft``
subprocesses it starts, a Ray's daemons, and each Ray actor and task worker (Ray Train's controller, its
synchronization actor, each training worker, Ray Data's helper actors). The per-test timings
(``RAYFT_TEST_TIMINGS``) give wall seconds only. This runs ``CMD``, samples its processes every quarter
second, and prints the CPU seconds of the processes started during the command,
summed by kind (a Ray process by the class or task name in its title). It counts the command and its
descendants only (it adopts the daemons ``ray start`` detaches), not what else runs on the machine. A
process that ends between two samples loses at most its last quarter second.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import psutil

SAMPLE_S = 0.25
"""Seconds between two samples: short enough that a Ray worker living a few seconds is seen."""

DRAIN_S = 30.0
"""How long the processes a command leaves running (daemons it detached, still stopping) are still
measured after it ends."""

_RAY_DAEMONS = (("raylet/raylet", "raylet"), ("gcs_server", "gcs"), ("dashboard/agent.py", "dashboard agent"),
                ("dashboard/dashboard.py", "dashboard"), ("runtime_env/agent", "runtime env agent"),
                ("log_monitor.py", "log monitor"), ("autoscaler/_private/monitor.py", "monitor"))  # fmt: skip


def process_kind(cmdline: Sequence[str]) -> str:
    """What kind of process ``cmdline`` (a process's arguments) is: a Ray daemon, a Ray worker by the
    name Ray gives its title (``ray::RayTrainWorker``; ``ray::IDLE`` while it waits for work), a
    ``rayft`` command by its subcommand, pytest, or the program's name."""
    joined = " ".join(cmdline)
    for marker, name in _RAY_DAEMONS:
        if marker in joined:
            return name
    if joined.startswith("ray::"):
        return joined.split()[0].split(".")[0]
    if "default_worker.py" in joined:
        return "ray::IDLE"
    for i, arg in enumerate(cmdline):
        if arg.endswith("/rayft") or arg == "rayft":
            return "rayft " + (cmdline[i + 1] if i + 1 < len(cmdline) else "")
        if arg.endswith("/pytest") or arg == "pytest":
            return "pytest"
    return cmdline[0].rsplit("/", 1)[-1] if cmdline else "?"


def _named(current: str | None, seen: str) -> str:
    """The better of two names seen for one process: a Ray worker is idle before it takes an actor."""
    return seen if current is None or current in ("ray::IDLE", "python", "python3") else current


def _become_subreaper() -> None:
    """Make this process adopt its orphaned descendants (Linux): the daemons ``ray start`` leaves
    behind stay in this process's tree, so that they count as the command's."""
    import ctypes

    pr_set_child_subreaper = 36
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def measure(command: Sequence[str]) -> tuple[float, int, dict[str, tuple[float, int]]]:
    """Run ``command``; return its wall seconds, its exit status, and ``{kind: (cpu_s, processes)}``
    over it and every process it started, directly or not."""
    _become_subreaper()
    cpu: dict[tuple[int, float], float] = {}
    names: dict[tuple[int, float], str] = {}
    started = time.time()
    child = subprocess.Popen(list(command))
    me = psutil.Process()
    status: int | None = None
    deadline = float("inf")  # once the command ended: until when what it left running is measured
    while True:
        running = me.children(recursive=True)
        if status is not None and (not running or time.time() >= deadline):
            break
        for proc in running:
            try:
                key = (proc.pid, proc.create_time())
                times = proc.cpu_times()
                cpu[key] = max(cpu.get(key, 0.0), times.user + times.system)
                names[key] = _named(names.get(key), process_kind(proc.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        # Reap what ended: the command (its status kept) and the orphans this process adopted.
        with contextlib.suppress(ChildProcessError):
            while (ended := os.waitpid(-1, os.WNOHANG))[0]:
                if ended[0] == child.pid:
                    status = os.waitstatus_to_exitcode(ended[1])
                    deadline = time.time() + DRAIN_S
        time.sleep(SAMPLE_S)
    child.returncode = status
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for key, seconds in cpu.items():
        total = by_kind[names.get(key, "?")]
        total[0] += seconds
        total[1] += 1
    return time.time() - started, status, {k: (v[0], int(v[1])) for k, v in by_kind.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the command after ``--`` and print a table of CPU seconds by kind of process."""
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0] in ("-h", "--help"):
        print("usage: python -m tests.support.process_cpu -- CMD ARGS\n\n" + (__doc__ or ""), file=sys.stderr)
        return 2
    wall, status, kinds = measure(command)
    total = sum(seconds for seconds, _ in kinds.values())
    print(f"wall {wall:.1f} s, CPU {total:.1f} s, exit {status}")
    print(f"{'CPU s':>8} {'procs':>5}  kind")
    for kind, (seconds, count) in sorted(kinds.items(), key=lambda item: -item[1][0]):
        if seconds >= 0.05:
            print(f"{seconds:8.1f} {count:5d}  {kind}")
    return status


if __name__ == "__main__":
    sys.exit(main())
