"""Python stacks of every live worker of a running Ray Job, read with py-spy (``rayft jobs stacks``),
so a hang can be read without logging in to the nodes.

A worker on this machine is dumped with the local py-spy; one on another node through the Ray
dashboard's traceback endpoint (py-spy on that node, ``RAY_DASHBOARD_ENABLE_PROFILING=1`` on the head).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rayft.errors import ClusterError
from rayft.runtime.probe import http_get

StackSource = Literal["local", "dashboard"]


@dataclass(frozen=True)
class JobWorker:
    """One live process of a job: a worker or the driver, with the node it runs on."""

    pid: int
    node_id: str
    ip: str
    kind: str


def job_workers(url: str, job_id: str, driver_pid: int | None) -> list[JobWorker]:
    """The live processes of the Ray job ``job_id`` (Ray's hex job id) by Ray's state API: its
    actors' (Ray Train's controller and workers among them) and its driver's."""
    from ray.util.state import list_actors, list_workers

    # Ray's worker rows carry no job id, its actor rows do: the job's processes are its actors' pids.
    actors = list_actors(address=url, filters=[("job_id", "=", job_id)], limit=10_000, raise_on_missing_output=False)
    kinds = {int(a.pid): str(a.class_name) for a in actors if a.state == "ALIVE" and a.pid}
    if driver_pid:
        kinds[driver_pid] = "DRIVER"
    rows = list_workers(address=url, limit=10_000, raise_on_missing_output=False)
    return select_job_processes([(int(r.pid), str(r.node_id), str(r.ip), bool(r.is_alive)) for r in rows], kinds)


def select_job_processes(rows: list[tuple[int, str, str, bool]], kinds: dict[int, str]) -> list[JobWorker]:
    """Of the cluster's worker processes (pid, node id, ip, alive), the live ones that ``kinds``
    names (pid to what runs there: an actor's class or ``DRIVER``), driver first."""
    found = [JobWorker(pid, node, ip, kinds[pid]) for pid, node, ip, alive in rows if alive and pid in kinds]
    return sorted(found, key=lambda w: (w.kind != "DRIVER", w.kind, w.pid))


def plan_stack_sources(workers: list[JobWorker], local_ips: Collection[str], py_spy_here: bool) -> list[StackSource]:
    """How to read each worker's stack: with this machine's py-spy when it runs here (and py-spy is
    installed), else through the dashboard of its node."""
    return ["local" if py_spy_here and w.ip in local_ips else "dashboard" for w in workers]


def local_ips() -> set[str]:
    """The addresses of this machine that Ray may report for a node on it: every IPv4 address of its
    interfaces (Ray may report one that the host name does not resolve to) and those of its names."""
    import psutil  # type: ignore[import-untyped] # a dependency of Ray's (which this module needs); no stubs

    ips = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    ips.add("127.0.0.1")
    for name in {socket.gethostname(), socket.getfqdn(), "localhost"}:
        try:
            ips.update(str(info[4][0]) for info in socket.getaddrinfo(name, None, socket.AF_INET))
        except OSError:
            continue
    return ips


def py_spy_path() -> str | None:
    """This machine's py-spy: on the PATH, or beside this Python (``ray[default]`` installs it into
    the environment's bin, which a venv used without activation leaves off the PATH)."""
    beside = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    return shutil.which("py-spy") or beside


def dump_stack(worker: JobWorker, source: StackSource, url: str, timeout_s: float = 30.0) -> str:
    """One worker's Python stacks as py-spy prints them."""
    if source == "local":
        py_spy = py_spy_path()
        assert py_spy is not None  # planned "local" only where it is installed
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(worker.pid)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            return f"(py-spy could not read pid {worker.pid}: {done.stderr.strip() or done.stdout.strip()})"
        return done.stdout
    query = urllib.parse.urlencode({"pid": worker.pid, "node_id": worker.node_id})
    status, body = http_get(f"{url.rstrip('/')}/worker/traceback?{query}", timeout_s)
    if status != 200:
        return (
            f"(the dashboard could not read pid {worker.pid} on {worker.ip}: {status} {body.strip()[:300]}; it needs "
            "py-spy on that node and RAY_DASHBOARD_ENABLE_PROFILING=1 on the head)"
        )
    return body


def require_workers(workers: list[JobWorker], job: str) -> None:
    """A job without live workers has no stacks to show: say so."""
    if not workers:
        raise ClusterError(f"job {job} has no live worker processes; `rayft jobs status {job}` shows whether it ended")
