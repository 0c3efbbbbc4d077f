"""``rayft jobs list | status ID | logs ID [--follow] | stop ID | stacks ID``: the Ray Jobs of a cluster.

These commands call :mod:`rayft.cluster` directly, not :mod:`rayft.api`: they run nothing of rayft's
(no recipe, no config), they ask a cluster's Jobs API about jobs that `rayft submit` started.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

import click

from rayft.cli.submit_cmd import ADDRESS_HELP, follow_to_end
from rayft.security import redact

_address_option = click.option("--address", default="auto", show_default=True, help=ADDRESS_HELP)


@click.group()
def jobs() -> None:
    """List, inspect, follow and stop the Ray Jobs of a cluster (`rayft submit` starts them)."""


@jobs.command("list")
@_address_option
def list_(address: str) -> None:
    """One line per job: id, status, rayft command and run, start time."""
    from rayft.cluster.jobs import client, jobs_url, status_name

    url = jobs_url(address)
    rows = sorted(client(url).list_jobs(), key=lambda info: info.start_time or 0)
    click.echo(f"{'job':<44} {'status':<10} {'command':<13} {'run':<20} started")
    for info in rows:
        meta = info.metadata or {}
        job = info.submission_id or info.job_id or "?"
        command = meta.get("rayft_command", "(not rayft)")
        click.echo(
            f"{job:<44} {status_name(info):<10} {command:<13} {meta.get('rayft_run', '-'):<20} {_time(info.start_time)}"
        )


@jobs.command()
@click.argument("job_id")
@_address_option
def status(job_id: str, address: str) -> None:
    """The job's status, message, times, entrypoint and rayft metadata."""
    from rayft.cluster.jobs import job_info, jobs_url, status_name

    info = job_info(jobs_url(address), job_id)
    click.echo(f"job:        {job_id}\nstatus:     {status_name(info)}")
    if info.message:
        click.echo(f"message:    {info.message}")
    click.echo(f"started:    {_time(info.start_time)}\nended:      {_time(info.end_time)}")
    if info.driver_exit_code is not None:
        click.echo(f"exit code:  {info.driver_exit_code}")
    click.echo(f"entrypoint: {info.entrypoint}")
    for key, value in sorted((info.metadata or {}).items()):
        click.echo(f"{key + ':':<11} {value}")


@jobs.command()
@click.argument("job_id")
@_address_option
@click.option("--follow", is_flag=True, help="Keep printing until the job ends; exit with its status.")
def logs(job_id: str, address: str, follow: bool) -> None:
    """The job's logs so far (credential values of this machine's environment masked)."""
    from rayft.cluster.jobs import client, job_info, jobs_url

    url = jobs_url(address)
    job_info(url, job_id)
    if follow:
        follow_to_end(url, job_id)
    click.echo(redact(client(url).get_job_logs(job_id)), nl=False)


@jobs.command()
@click.argument("job_id")
@_address_option
@click.option(
    "--wait-s", type=click.FloatRange(min=0), default=600, show_default=True, help="How long to wait for it to end."
)
def stop(job_id: str, address: str, wait_s: float) -> None:
    """Stop the job through rayft's SIGTERM path: a training run saves a checkpoint first, and
    `rayft submit CONFIG --resume` continues it."""
    from rayft.cluster.jobs import client, job_info, jobs_url, status_name, wait_until_done

    url = jobs_url(address)
    before = job_info(url, job_id)
    if status_name(before) in ("SUCCEEDED", "FAILED", "STOPPED"):
        click.echo(f"Job {job_id} already ended: {status_name(before)}")
        return
    client(url).stop_job(job_id)
    click.echo(f"Stopping {job_id}: SIGTERM sent; a training run saves a checkpoint before it ends.", err=True)
    info = wait_until_done(url, job_id, timeout_s=wait_s)
    click.echo(f"Job {job_id} {status_name(info)}")
    if status_name(info) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        sys.exit(1)
    if (before.metadata or {}).get("rayft_command") == "train":
        click.echo(f"Continue it: rayft submit CONFIG --command train --resume --address {url}")


@jobs.command()
@click.argument("job_id")
@_address_option
def stacks(job_id: str, address: str) -> None:
    """The Python stacks of every live process of the job (py-spy), to read a hang without logging
    in to the nodes."""
    from rayft.cluster.jobs import job_info, jobs_url
    from rayft.cluster.stacks import (
        dump_stack,
        job_workers,
        local_ips,
        plan_stack_sources,
        py_spy_path,
        require_workers,
    )

    url = jobs_url(address)
    info = job_info(url, job_id)
    driver = getattr(info, "driver_info", None)
    workers = job_workers(url, info.job_id or job_id, int(driver.pid) if driver and driver.pid else None)
    require_workers(workers, job_id)
    sources = plan_stack_sources(workers, local_ips(), py_spy_here=py_spy_path() is not None)
    for worker, source in zip(workers, sources, strict=True):
        click.echo(f"=== {worker.kind} pid {worker.pid} on {worker.ip} (node {worker.node_id[:12]}) ===")
        click.echo(redact(dump_stack(worker, source, url)))


def _time(ms: Any) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
