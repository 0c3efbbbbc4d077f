"""The ``rayft`` entry point: the command group, error handling, and logging set-up.

Only click, pydantic and yaml are imported here; each command imports what it needs when it runs,
so ``rayft --help`` stays fast and loads neither torch nor ray.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from rayft._version import __version__
from rayft.cli import (
    config_cmd,
    data_cmd,
    eval_cmd,
    infer_cmd,
    jobs_cmd,
    k8s_cmd,
    pairs_cmd,
    profile_cmd,
    run_cmd,
    sdg_cmd,
    serve_cmd,
    submit_cmd,
    train_cmd,
    tune_cmd,
)
from rayft.cli.common import CliState
from rayft.console import setup_console
from rayft.errors import RayftError
from rayft.security import install_redaction

OVERRIDES_HELP = (
    "Any config field can be set after the config file with a dotted override, e.g. "
    "`train.learning_rate=1e-4 lora.r=8`. `rayft config fields` lists them all."
)


class _RayftGroup(click.Group):
    """A click group that prints rayft errors as one line, without a traceback (unless --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RayftError as exc:
            state = ctx.find_object(CliState)
            if state is not None and state.debug:
                raise
            click.secho(f"Error: {exc}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_RayftGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rayft")
@click.option("--debug", is_flag=True, help="Show full tracebacks and debug logs (implies --verbose).")
@click.option(
    "--verbose",
    is_flag=True,
    help="Show Ray's own logs and progress on the console too (always in <run>/logs/rayft.log).",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """rayft: synthetic data, fine-tuning, evaluation and export of LLMs on Ray.

    Every command takes a YAML config and optional dotted overrides. A laptop runs it on an
    embedded local Ray; a cluster runs the same config with scaling.address set.
    """
    install_redaction()  # first: the console handler set up next writes through the masked stderr
    ctx.obj = CliState(debug=debug)
    setup_console(verbose=verbose, debug=debug)


def _register() -> None:
    cli.add_command(config_cmd.config)
    cli.add_command(train_cmd.train)
    cli.add_command(tune_cmd.tune)
    cli.add_command(data_cmd.data)
    cli.add_command(run_cmd.run)
    cli.add_command(sdg_cmd.sdg)
    cli.add_command(pairs_cmd.pairs)
    cli.add_command(eval_cmd.eval_)
    cli.add_command(eval_cmd.compare)
    cli.add_command(eval_cmd.export)
    cli.add_command(infer_cmd.chat)
    cli.add_command(infer_cmd.generate)
    cli.add_command(k8s_cmd.k8s)
    cli.add_command(profile_cmd.profile)
    cli.add_command(serve_cmd.serve)
    _register_cluster()


def _register_cluster() -> None:
    cli.add_command(submit_cmd.submit)
    cli.add_command(jobs_cmd.jobs)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="rayft")


if __name__ == "__main__":
    main()
