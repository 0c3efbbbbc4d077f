"""Pieces shared by the CLI commands: state, the config argument, override handling."""

from __future__ import annotations

from dataclasses import dataclass

import click

from rayft.config import RayftConfig, load_config


@dataclass
class CliState:
    """Options of the top-level ``rayft`` group, passed to every command."""

    debug: bool = False


config_argument = click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
overrides_argument = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")


def load_cli_config(config_path: str, overrides: tuple[str, ...]) -> RayftConfig:
    """Load the config file named on the command line with its dotted overrides."""
    return load_config(config_path, list(overrides))
