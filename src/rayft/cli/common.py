"""Pieces shared by the CLI commands: state, the config argument, override handling."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import click

from rayft.cache import cache_root
from rayft.config import RayftConfig, load_config
from rayft.console import attach_log_file
from rayft.runs.layout import LOG_FILE
from rayft.runs.location import log_dir
from rayft.runs.lock import refuse_if_held

log = logging.getLogger("rayft.cli")


@dataclass
class CliState:
    """Options of the top-level ``rayft`` group, passed to every command."""

    debug: bool = False


config_argument = click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
overrides_argument = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")


def load_cli_config(config_path: str, overrides: tuple[str, ...]) -> RayftConfig:
    """Load the config file named on the command line with its dotted overrides."""
    return load_config(config_path, list(overrides))


def open_run_log(cfg: RayftConfig, directory: Path | None = None, *, run_name: str | None = None) -> Path | None:
    """Send the full log (Ray's loggers included) to ``<run>/logs/rayft.log``, or under ``directory``.

    The run is ``cfg.name`` unless ``run_name`` names another under ``storage_path`` (a sweep's).
    With a URI as ``storage_path`` the file goes under the cache (``<cache>/logs/<name>/``).
    """
    if directory is None:
        directory = log_dir(cfg.storage_path, run_name or cfg.name, cache_root())
    refuse_if_held(directory)  # a second driver of a run must not write into the first one's log
    path = attach_log_file(directory / LOG_FILE)
    if path is not None:
        log.info("full log: %s (rayft --verbose also shows Ray's output here)", path)
    return path
