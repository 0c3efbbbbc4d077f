"""Real servers for the tracking and monitoring tests: an MLflow tracking server (SQLite backend, local
artifact root) and a Prometheus server, each on a free port of 127.0.0.1, stopped at the end.

::

    with mlflow_server(tmp_path) as server:
        # logging.mlflow.tracking_uri=<server.uri>
        ...
        server.kill()          # an outage: the process is gone, the port refuses
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int, outside: range = range(0)) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that nothing listens on now, none in ``outside`` (a
    node's worker port range: Ray refuses to start when one of its other ports falls inside it).

    Every probe stays bound until all are chosen: the kernel may hand a port it has just released to
    the next probe, and Ray refuses to start a node whose two components were given the same port."""
    with contextlib.ExitStack() as probes:
        ports: list[int] = []
        while len(ports) < count:
            probe = probes.enter_context(socket.socket())
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
            if port not in outside:
                ports.append(port)
        return ports


def wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 240.0) -> None:
    """Wait until ``url`` answers 200; fail with the server's log when it exits or takes too long.

    The wait ends on the answer or on the server's exit; the clock only stops a server that hangs. It is
    long because a start on a loaded 2-core machine is slow: ``mlflow server`` (its database created, then
    its app imported) once took over 60 s there while both cores ran other tests and a measurement."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-3000:]}")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:g} s: {log.read_text()[-3000:]}")


@dataclass
class Server:
    """A server process and its base URL."""

    uri: str
    process: subprocess.Popen[bytes]
    directory: Path

    def kill(self) -> None:
        """SIGKILL the server and its children (an outage, not a shutdown)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@contextlib.contextmanager
def _running(
    command: list[str], directory: Path, health_url: str, base_uri: str, env: dict[str, str] | None = None
) -> Iterator[Server]:
    log = directory / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=directory, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    server = Server(base_uri, process, directory)
    try:
        wait_http(health_url, process, log)
        yield server
    finally:
        if process.poll() is None:
            server.kill()


@contextlib.contextmanager
def mlflow_server(directory: Path) -> Iterator[Server]:
    """``mlflow server`` with a SQLite backend and a local artifact root under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [
        str(mlflow) if mlflow.exists() else "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}",
        "--artifacts-destination", str(directory / "artifacts"), "--workers", "1",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    # MLflow's job runner (seven task-queue consumers for server-side jobs rayft never submits) would
    # take both cores of a small machine for its first seconds: tests and benchmarks keep it off.
    quiet = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _running(command, directory, f"{base}/health", base, env=quiet) as server:
        yield server


PROMETHEUS = "/usr/bin/prometheus"


def have_prometheus() -> bool:
    """Whether the Prometheus server (Debian's ``prometheus`` package) is installed."""
    return Path(PROMETHEUS).exists() or shutil.which("prometheus") is not None


@contextlib.contextmanager
def prometheus_server(
    directory: Path, targets: list[str], *, scrape_interval_s: float = 1.0, bearer_token: str | None = None
) -> Iterator[Server]:
    """A Prometheus scraping ``targets`` (``host:port``) every ``scrape_interval_s`` (with ``bearer_token``
    as its Authorization when given), its TSDB under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    interval = f"{int(scrape_interval_s * 1000)}ms"
    config = directory / "prometheus.yml"
    quoted = ", ".join(f"'{t}'" for t in targets)
    auth = f"    authorization: {{credentials: '{bearer_token}'}}\n" if bearer_token else ""
    config.write_text(
        f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
        f"scrape_configs:\n  - job_name: rayft\n{auth}    static_configs:\n      - targets: [{quoted}]\n"
    )
    port = free_port()
    command = [
        shutil.which("prometheus") or PROMETHEUS, f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with _running(command, directory, f"{base}/-/ready", base) as server:
        yield server
