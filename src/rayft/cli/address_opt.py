"""``--address`` on every command that uses Ray: join a cluster, or run the command as a Ray Job."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from rayft.cli.common import load_cli_config
from rayft.cli.submit_cmd import submit_config
from rayft.errors import ConfigError
from rayft.runtime import check_address
from rayft.runtime.address import parse_address

ADDRESS_HELP = (
    "Run on a Ray cluster: auto (the one this machine belongs to), HEAD:6379 (join the head's GCS "
    "directly; from a machine of the cluster's network) or http://HEAD:8265 (submit this command as a Ray "
    "Job, as `rayft submit` does). Sets scaling.address. Unset: a local Ray for this command."
)

LOCAL_HELP = (
    "Join a Ray cluster: auto (the one this machine belongs to) or HEAD:6379 (the head's GCS address; from "
    "a machine of the cluster's network). Sets scaling.address. Unset: a local Ray for this command."
)


def address_option(command: str, *, as_job: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add ``--address`` to the click command function ``command`` (a name of
    :data:`rayft.cluster.job_plan.COMMANDS`): a Jobs API URL submits the same command line as a Ray
    Job; any other address becomes the override ``scaling.address=ADDRESS``. A command that reads
    and writes files on this machine (``as_job=False``) refuses a Jobs API URL instead."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @click.option("--address", default=None, metavar="ADDRESS", help=ADDRESS_HELP if as_job else LOCAL_HELP)
        @functools.wraps(function)
        def wrapper(*args: Any, address: str | None, **kwargs: Any) -> Any:
            if address is not None:
                if parse_address(address).kind == "jobs":
                    if not as_job:
                        _refuse_job(command, address)
                    _submit_instead(command, address, kwargs)
                check_address(address)  # before the command writes anything: seconds, not Ray's 20 s
                kwargs["overrides"] = (*kwargs["overrides"], f"scaling.address={address}")
            return function(*args, **kwargs)

        return wrapper

    return decorate


def _refuse_job(command: str, address: str) -> None:
    raise ConfigError(
        f"--address {address}: `rayft {command}` reads and writes files on this machine, so it joins the "
        "cluster rather than running as a Ray Job; give the head's GCS address (HEAD:6379), or run it on a "
        "node of the cluster with --address auto"
    )


def _submit_instead(command: str, address: str, params: dict[str, Any]) -> None:
    """Submit the command being run, with its config and options, as a Ray Job at ``address``."""
    cfg = load_cli_config(params["config_path"], params["overrides"])
    resume = bool(params.get("resume"))
    rest = {name: value for name, value in params.items() if name not in ("config_path", "overrides", "resume")}
    submit_config(cfg, address=address, command=command, resume=resume, extra_args=option_args(rest))


def option_args(values: dict[str, Any]) -> tuple[str, ...]:
    """The command-line options that give the current click command ``values`` (those set)."""
    ctx = click.get_current_context()
    args: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name not in values:
            continue
        value = values[param.name]
        if value is None or value is False or value in ((), param.default):
            continue
        flag = max(param.opts, key=len)
        if param.is_flag:
            args.append(flag if value is True else (param.secondary_opts or [flag])[0])
        elif param.multiple:
            args += [part for item in value for part in (flag, str(item))]
        else:
            args += [flag, str(value)]
    return tuple(args)
