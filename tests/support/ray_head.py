"""A real Ray head (``ray start --head``, with or without the dashboard and its Jobs API) started
for tests on free ports of 127.0.0.1, with its own temp dir and token, and stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from rayft._ray_private import LOCAL_RAY_TRAIN_ENV
from tests.support.servers import free_port, free_ports

_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class RayHead:
    """A running head: its GCS address, Jobs API URL (None without the dashboard) and the
    environment (token included) a client of it needs."""

    gcs: str
    jobs_url: str | None
    env: dict[str, str]
    temp_dir: Path
    log: Path

    def gcs_answers(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether ``ray status`` reaches the head (with ``env``; default: this process's with the
        client's token)."""
        status = [str(_BIN / "ray"), "status", f"--address={self.gcs}"]
        run_env = dict(env) if env is not None else {**os.environ, **self.env}
        return subprocess.run(status, check=False, env=run_env, capture_output=True, timeout=60).returncode == 0


NO_DASHBOARD = "--include-dashboard=false"


@contextlib.contextmanager
def ray_head(
    *, num_cpus: int = 2, dashboard: bool = True, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> Iterator[RayHead]:
    """Start ``ray start --head --block`` with token authentication (a token of its own) and yield it."""
    # Ray's socket paths must stay short: its temp dir cannot live under pytest's long tmp_path.
    temp = Path(tempfile.mkdtemp(prefix="rft-", dir="/tmp"))
    token = temp / "token"
    token.write_text(secrets.token_hex(32))
    path = f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # the jobs' `python` is this one
    head_env = {**_train_env(), **os.environ, **(env or {}), "RAY_ADDRESS": "", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(token), "PATH": path}  # fmt: skip
    client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    log = temp / "head.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        # A port chosen free can be taken before the head binds it (the other test workers start Ray processes
        # too), and `ray start --block` then stops the whole head: such a start is tried once more on new ports.
        for _attempt in range(2):
            port, dash, client, agent_http, metrics, runtime_env, agent_grpc = free_ports(7)
            command = [
                str(_BIN / "ray"), "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}",
                "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={temp / 'ray'}",
                f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
                f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
                f"--dashboard-agent-grpc-port={agent_grpc}",
                *([f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1"] if dashboard else [NO_DASHBOARD]),
            ]  # fmt: skip
            with log.open("w") as out:
                proc = subprocess.Popen(command, env=head_env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
            head = RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}" if dashboard else None, client_env, temp,
                           log)  # fmt: skip
            # Jobs go to the head's dashboard agent, which comes up after the dashboard answers.
            if _wait_until_up(head, proc, head_env, timeout_s, agent_http if dashboard else None):
                break
            _stop(proc)
        else:
            raise RuntimeError(f"the Ray head did not start:\n{log.read_text()[-3000:]}")
        yield head
    finally:
        if proc is not None:  # the head is stopped however the start or the tests ended
            _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def ray_worker_node(
    head: RayHead,
    *,
    num_cpus: int = 1,
    resources: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60,
) -> Iterator[Path]:
    """Join a second node to ``head`` on this machine (``ray start --address``), with ports of its
    own, the custom ``resources`` that place work on it, and its own environment (``env``: a
    ``RAYFT_CACHE`` of its own, say); yield its log file. The head's token authenticates it."""
    import json

    path = f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    node_env = {**os.environ, **(env or {}), **head.env, "RAY_ADDRESS": "", "PATH": path}
    worker_port = free_port()
    workers = range(worker_port, worker_port + 201)
    node_manager, object_manager, metrics, runtime_env, agent_http, agent_grpc = free_ports(6, outside=workers)
    command = [
        str(_BIN / "ray"), "start", "--block", f"--address={head.gcs}", f"--num-cpus={num_cpus}",
        f"--resources={json.dumps(dict(resources or {}))}", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
        f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
        f"--dashboard-agent-listen-port={agent_http}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--min-worker-port={worker_port}", f"--max-worker-port={worker_port + 200}",
        "--object-store-memory=100000000",
    ]  # fmt: skip
    log = head.temp_dir / f"node-{worker_port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=node_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_node(proc, log, timeout_s)
        yield log
    finally:
        _stop(proc, grace_s=3)


def _wait_for_node(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Until ``ray start`` says the node is up (it prints this once its raylet has registered)."""
    deadline = time.monotonic() + timeout_s
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Ray worker node did not join:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _train_env() -> dict[str, str]:
    """The Ray Train settings of rayft's own Ray (its controller looks at the workers twice a
    second, no preemption watcher) for a test head's processes, which the runs and jobs on it
    inherit: a run then ends seconds sooner after its last step. An exported variable wins."""
    return dict(LOCAL_RAY_TRAIN_ENV)


def _wait_until_up(
    head: RayHead, proc: subprocess.Popen[bytes], env: dict[str, str], timeout_s: float, agent_port: int | None
) -> bool:
    """Whether the head came up (its GCS, dashboard and dashboard agent answer); False if it exited first."""
    deadline = time.monotonic() + timeout_s
    while (not head.gcs_answers(env) or (head.jobs_url and not _http_up(head.jobs_url))
           or (agent_port is not None and not _port_open(agent_port))):  # fmt: skip
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray head did not start within {timeout_s} s:\n{head.log.read_text()[-3000:]}")
        time.sleep(1)
    return True


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _http_up(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{url}/api/version", timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answers (401 without the token)
    except OSError:
        return False
    return True


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 3) -> None:
    """SIGTERM the head's process group (its GCS, raylet, dashboard and workers), SIGKILL what is left.

    Every process of the group gets the SIGTERM itself; a test head's state is thrown away with its
    temp dir, so whatever has not exited after a short grace is killed rather than waited for."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
