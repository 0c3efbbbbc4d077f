"""``rayft submit CONFIG [KEY=VALUE]... --address http://HEAD:8265``: run a rayft command as a Ray Job.

It calls :mod:`rayft.cluster` directly, not :mod:`rayft.api`: it runs nothing here, it hands a command
line to a cluster, where the job runs `rayft COMMAND CONFIG` (and so the API) on the head.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

import rayft
from rayft._version import __version__
from rayft.cli.common import config_argument, load_cli_config, overrides_argument
from rayft.cluster.job_plan import COMMANDS, JobRequest, exit_code
from rayft.config import RayftConfig, dump_config
from rayft.config.checks import is_remote

ADDRESS_HELP = (
    "The cluster: http://HEAD:8265 (its Jobs API), HEAD:6379 (its GCS address; rayft finds the Jobs API "
    "from it) or auto (RAY_ADDRESS, else the head started on this machine)."
)


@click.command(
    epilog="Example: rayft submit configs/quickstart.yaml train.max_steps=50 --address http://10.0.0.5:8265 "
    "--env HF_TOKEN"
)
@config_argument
@overrides_argument
@click.option("--address", default="auto", show_default=True, help=ADDRESS_HELP)
@click.option(
    "--command", type=click.Choice(COMMANDS), default="train", show_default=True, help="The rayft command the job runs."
)
@click.option(
    "--working-dir",
    type=click.Path(exists=True, file_okay=False),
    help="Upload this directory as the job's working directory (relative paths of the config resolve there) and "
    "run this machine's rayft source instead of pip-installing rayft==<this version> on the cluster.",
)
@click.option("--resume", is_flag=True, help="Continue the training run of CONFIG from its last checkpoint.")
@click.option("--no-follow", is_flag=True, help="Print the job id and return instead of following the logs.")
@click.option(
    "--env",
    "env_names",
    multiple=True,
    metavar="NAME",
    help="A credential variable the run needs (repeatable). Only the name goes with the job; the cluster's "
    "environment must provide the value, and the job fails at once if it does not.",
)
@click.option(
    "--arg",
    "extra_args",
    multiple=True,
    metavar="ARG",
    help="An extra argument for the command, e.g. --arg=--test-mode.",
)
def submit(  # noqa: PLR0917 (click passes options positionally)
    config_path: str,
    overrides: tuple[str, ...],
    address: str,
    command: str,
    working_dir: str | None,
    resume: bool,
    no_follow: bool,
    env_names: tuple[str, ...],
    extra_args: tuple[str, ...],
) -> None:
    """Run `rayft COMMAND CONFIG` on a Ray cluster as a Ray Job, with the resolved config uploaded beside it.

    Prints the job id, follows its logs (Ctrl-C detaches; the job keeps running) and exits with the
    job's status: 0 if it succeeded, 143 if it was stopped, else the job's exit code.
    """
    cfg = load_cli_config(config_path, overrides)
    submit_config(
        cfg, address=address, command=command, working_dir=working_dir, resume=resume,
        follow=not no_follow, env_names=env_names, extra_args=extra_args,
    )  # fmt: skip


def submit_config(
    cfg: RayftConfig,
    *,
    address: str,
    command: str,
    working_dir: str | None = None,
    resume: bool = False,
    follow: bool = True,
    env_names: tuple[str, ...] = (),
    extra_args: tuple[str, ...] = (),
) -> NoReturn:
    """Submit ``cfg`` as a job running ``rayft COMMAND``, then follow it (or not) and exit."""
    from rayft.cluster.jobs import jobs_url, submit

    url = jobs_url(address)
    _warn_relative_storage(cfg)
    shipped = cfg.model_copy(update={"scaling": cfg.scaling.model_copy(update={"address": None})})
    request = JobRequest(
        command=command, run_name=cfg.name, rayft_version=__version__, resume=resume,
        extra_args=extra_args, working_dir=str(Path(working_dir).resolve()) if working_dir else None,
        source_dir=str(Path(rayft.__file__).parent) if working_dir else None, env_names=env_names,
        stop_grace_s=cfg.failure.sigterm_grace_s,
    )  # fmt: skip
    plan = submit(url, request, dump_config(shipped))
    job = plan.submission_id
    click.echo(f"Submitted job {job} to {url} ({plan.metadata['rayft_source']})")
    if not follow:
        click.echo(f"Follow it: rayft jobs logs {job} --follow --address {url}")
        sys.exit(0)
    follow_to_end(url, job)


def follow_to_end(url: str, job: str) -> NoReturn:
    """Follow the job's logs until it ends and exit with its status; Ctrl-C detaches."""
    from rayft.cluster.jobs import follow_logs, status_name, wait_until_done

    try:
        follow_logs(url, job, lambda text: click.echo(text, nl=False))
    except KeyboardInterrupt:
        click.echo(
            f"\nDetached; job {job} keeps running. Re-attach: rayft jobs logs {job} --follow --address {url}; "
            f"stop it (saving a checkpoint): rayft jobs stop {job} --address {url}",
            err=True,
        )
        sys.exit(0)
    info = wait_until_done(url, job, timeout_s=60)
    status = status_name(info)
    message = f": {info.message}" if status != "SUCCEEDED" and info.message else ""
    click.echo(f"Job {job} {status}{message}", err=True)
    sys.exit(exit_code(status, info.driver_exit_code))


def _warn_relative_storage(cfg: RayftConfig) -> None:
    # A check of the config before it is submitted: no run, and so no store, exists on this machine.
    if not is_remote(cfg.storage_path) and not Path(cfg.storage_path).is_absolute():
        click.secho(
            f"Warning: storage_path {cfg.storage_path!r} is relative: on the cluster it resolves in the job's "
            "working directory, a temporary directory that Ray manages. Use an absolute path that the head and every "
            "worker node share, or a URI (s3://...).",
            fg="yellow",
            err=True,
        )
