"""What a Ray Job of rayft is made of (pure): its entrypoint, runtime environment and metadata.

The resolved config travels as a small Python package uploaded with the job (a ``py_modules``
entry holding ``config.yaml``); the job's entry (:mod:`rayft.cli.job_entry`) finds it there and runs
``rayft <command> <that config>``. rayft itself is either pinned (``pip: rayft==<version>``, the
version installed here) or shipped from this machine's source (``py_modules``) with ``--working-dir``.

Credentials are never part of a job: its spec (entrypoint, runtime environment, metadata) is
stored by the head and shown by ``ray job list`` and the dashboard to anyone who can reach them.
Only the *names* of the variables the run needs are passed; the entry checks on the cluster that
each one is set there (exported before ``ray start`` on every node, or a Kubernetes Secret).
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

from rayft.errors import ConfigError

COMMANDS = ("train", "tune", "run", "sdg", "eval", "compare", "data-prepare")
# The rayft command line of each --command (data-prepare is a subcommand of `rayft data`).
COMMAND_ARGS = {name: name.split("-") if name == "data-prepare" else [name] for name in COMMANDS}
CONFIG_FILE = "config.yaml"
# Seconds Ray's job supervisor waits after SIGTERM before SIGKILL, beyond the run's own grace.
STOP_MARGIN_S = 30
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class JobRequest:
    """What the user asked ``rayft submit`` for."""

    command: str
    run_name: str
    rayft_version: str
    resume: bool = False
    extra_args: tuple[str, ...] = ()
    working_dir: str | None = None
    source_dir: str | None = None
    env_names: tuple[str, ...] = ()
    stop_grace_s: float = 120.0
    entrypoint_num_cpus: float | None = None


@dataclass(frozen=True)
class JobPlan:
    """A Ray Job as rayft submits it; ``config_module`` is the package the config is uploaded in."""

    submission_id: str
    config_module: str
    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


def plan_job(request: JobRequest, token: str | None = None) -> JobPlan:
    """The entrypoint, runtime environment and metadata of ``request``; ``token`` names it (random
    by default). Refuses ``--resume`` where the command has none and bad variable names."""
    _check(request)
    token = token or secrets.token_hex(4)
    module = f"rayft_job_{token}"
    entry = ["python", "-m", "rayft.cli.job_entry", "--config-module", module]
    entry += [arg for name in request.env_names for arg in ("--require-env", name)]
    entry += ["--", *COMMAND_ARGS[request.command], *(["--resume"] if request.resume else []), *request.extra_args]
    runtime_env: dict[str, Any] = {
        # Read by Ray's job supervisor: how long `rayft jobs stop` lets the run save before SIGKILL.
        "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(int(request.stop_grace_s) + STOP_MARGIN_S)},
    }
    if request.working_dir:
        runtime_env["working_dir"] = request.working_dir
    if request.source_dir:
        runtime_env["py_modules"] = [request.source_dir]
    else:
        runtime_env["pip"] = [f"rayft=={request.rayft_version}"]
    metadata = {
        "rayft_command": request.command,
        "rayft_run": request.run_name,
        "rayft_version": request.rayft_version,
        "rayft_source": "local source" if request.source_dir else f"pip rayft=={request.rayft_version}",
    }
    safe_name = _ID_SAFE.sub("-", request.run_name).strip("-.")[:40] or "run"
    return JobPlan(
        submission_id=f"rayft-{request.command}-{safe_name}-{token}",
        config_module=module,
        entrypoint=shlex.join(entry),
        runtime_env=runtime_env,
        metadata=metadata,
    )


def _check(request: JobRequest) -> None:
    if request.command not in COMMANDS:
        raise ConfigError(f"--command {request.command!r}: not a rayft command a job can run; use one of {COMMANDS}")
    if request.resume and request.command != "train":
        raise ConfigError(
            f"--resume continues a training run; `rayft {request.command}` has none (`rayft run` skips the "
            "stages whose inputs did not change by itself). Use --command train --resume."
        )
    bad = [name for name in request.env_names if not _ENV_NAME.match(name)]
    if bad:
        raise ConfigError(
            f"--env {bad[0]!r}: not an environment variable name. --env takes a NAME only (its value stays on "
            "the cluster), e.g. --env HF_TOKEN"
        )


def exit_code(status: str, driver_exit_code: int | None) -> int:
    """The exit status of ``rayft submit`` for a finished job: 0 when it succeeded, 143 (as after
    SIGTERM) when it was stopped, else the job's own exit code (1 if it has none)."""
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 143
    return driver_exit_code if driver_exit_code else 1
