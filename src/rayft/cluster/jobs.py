"""Ray Jobs for rayft: submit a command with its resolved config, follow, list, inspect and stop jobs."""

from __future__ import annotations

import asyncio
import inspect
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayft.cluster.job_plan import CONFIG_FILE, JobPlan, JobRequest, plan_job
from rayft.errors import ClusterError, first_line
from rayft.runtime.address import parse_address
from rayft.runtime.probe import check_jobs_api, dashboard_of, resolve_auto
from rayft.security import redact

log = logging.getLogger(__name__)

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")

AGENT_WAIT_S = 30.0
"""How long a submission waits for the head's job agent: a head that has just started answers on its Jobs API
before its dashboard agent has registered, and Ray refuses jobs until then ("No available agent ... try again
later")."""


def jobs_url(address: str) -> str:
    """The Jobs API URL that ``address`` leads to, checked to answer (and to accept this process's token)."""
    target = resolve_auto(parse_address(address))
    if target.kind == "client":
        raise ClusterError(
            f"--address {target.text} is a Ray Client address; Ray Jobs use the head's Jobs API: "
            "--address http://HEAD:8265 (or the GCS address HEAD:6379, from which rayft finds it)"
        )
    url = dashboard_of(target.text) if target.kind == "gcs" else target.text
    version = check_jobs_api(url)
    _warn_version(url, version)
    return url


def _warn_version(url: str, version: str) -> None:
    import ray

    if version != ray.__version__:
        log.warning(
            "the cluster at %s runs Ray %s and this machine Ray %s; jobs may fail", url, version, ray.__version__
        )


def client(url: str) -> Any:
    """A JobSubmissionClient for a checked Jobs API URL, whose refused requests raise a one-line
    :class:`ClusterError` (:class:`_Refusals`)."""
    from ray.job_submission import JobSubmissionClient

    return _Refusals(url, JobSubmissionClient(url))


class _Refusals:
    """Ray's JobSubmissionClient, each of whose calls raises a request the Jobs API refused (Ray's SDK raises
    RuntimeError with the response's body, a server-side traceback at times) as a one-line ClusterError that
    names the head and Ray's reason, so that no command shows a stack for it."""

    def __init__(self, url: str, jobs: Any) -> None:
        self._url, self._jobs = url, jobs

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._jobs, name)
        if not callable(method) or inspect.isasyncgenfunction(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except RuntimeError as exc:
                reason = redact(first_line(exc))
                raise ClusterError(f"the Ray Jobs API at {self._url} refused the request: {reason}") from exc

        return call


def submit(url: str, request: JobRequest, config_yaml: str) -> JobPlan:
    """Submit ``request`` with ``config_yaml`` uploaded beside it; return the plan (its id is the job's)."""
    plan = plan_job(request)
    with tempfile.TemporaryDirectory(prefix="rayft-job-") as staging:
        package = Path(staging) / plan.config_module
        package.mkdir()
        # Ray names uploaded packages by their content: the job's id makes this one its own.
        init = f'"""The config of the rayft Ray Job {plan.submission_id}."""\n'
        (package / "__init__.py").write_text(init, encoding="utf-8")
        (package / CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
        runtime_env = dict(plan.runtime_env)
        runtime_env["py_modules"] = [str(package), *runtime_env.get("py_modules", [])]
        _submit_job(
            url,
            entrypoint=plan.entrypoint,
            submission_id=plan.submission_id,
            runtime_env=runtime_env,
            metadata=plan.metadata,
            entrypoint_num_cpus=request.entrypoint_num_cpus,
        )
    return plan


def _submit_job(url: str, wait_s: float = AGENT_WAIT_S, poll_s: float = 2.0, **job: Any) -> None:
    """Ray's ``submit_job``, retried while the head has no job agent yet (up to ``wait_s``); a refusal is a
    one-line :class:`ClusterError` naming the head, Ray's reason and what to do."""
    jobs = client(url)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            jobs.submit_job(**job)
            return
        except ClusterError as exc:
            if "No available agent" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"the Ray head at {url} has had no job agent for {wait_s:.0f} s ({exc}); check the head "
                    "(`ray status`, the dashboard_agent log in its session's logs directory) and submit again"
                ) from exc
        time.sleep(poll_s)


def follow_logs(url: str, job_id: str, write: Callable[[str], None]) -> None:
    """Write the job's logs as they come (from the start) until the job ends, credentials masked."""

    async def tail() -> None:
        async for chunk in client(url).tail_job_logs(job_id):
            write(redact(chunk))

    asyncio.run(tail())


def wait_until_done(url: str, job_id: str, timeout_s: float, poll_s: float = 1.0) -> Any:
    """The job's details once it has ended, or after ``timeout_s`` (then its status is not terminal)."""
    jobs = client(url)
    deadline = time.monotonic() + timeout_s
    while True:
        info = jobs.get_job_info(job_id)
        if str(info.status) in TERMINAL or time.monotonic() > deadline:
            return info
        time.sleep(poll_s)


def job_info(url: str, job_id: str) -> Any:
    """The job's details; an unknown id fails naming `rayft jobs list`."""
    try:
        return client(url).get_job_info(job_id)
    except ClusterError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            raise ClusterError(f"no job {job_id!r} at {url}; `rayft jobs list --address {url}` lists them") from exc
        raise


def status_name(info: Any) -> str:
    """A job status as its plain name (SUCCEEDED...)."""
    status = info.status
    return str(getattr(status, "value", status))
