"""Every default lives once: the commands' help reads the config's defaults, and the CLI's default
model and report directories are the Python API's."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rayft import api
from rayft.cli.defaults import config_default
from rayft.cli.main import cli
from rayft.config import load_config
from rayft.errors import StorageError
from rayft.runs.defaults import default_model, default_report_dir

_SHOWN = re.compile(r"\[([a-z_]+(?:\.[a-z_]+)+): ([^\]]+)\]")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
    return found


def test_every_default_a_help_shows_is_the_configs() -> None:
    shown: dict[str, str] = {}
    runner = CliRunner()
    for command in _commands(cli):
        result = runner.invoke(cli, [*command, "--help"], terminal_width=1000)
        assert result.exit_code == 0, (command, result.output)
        shown |= dict(_SHOWN.findall(" ".join(result.output.split())))
    for path in ("inference.max_new_tokens", "inference.temperature", "inference.backend", "export.merge"):
        assert path in shown  # the options that show a config default still do
    for path, value in shown.items():
        assert config_default(path) == f"{path}: {value}", f"--help shows {path}: {value}"


def test_config_default_reads_the_schema() -> None:
    cfg = load_config(None, [])
    assert config_default("inference.top_p") == f"inference.top_p: {cfg.inference.top_p}"
    assert config_default("inference.seed") == "inference.seed: unset"
    assert config_default("export.merge") == "export.merge: true"
    with pytest.raises(KeyError):
        config_default("inference.top_p.nested")


def test_the_default_model_is_the_run_directory_once_it_exists(tmp_path: Path) -> None:
    cfg = load_config(None, [f"storage_path={tmp_path}", "name=demo"])
    where = {"command": "rayft eval", "fix": "pass --model"}
    assert default_model(cfg, **where) == cfg.model.name
    (tmp_path / "demo").mkdir()
    assert default_model(cfg, **where) == str(tmp_path / "demo")
    assert default_report_dir(cfg, "compare", **where) == tmp_path / "demo" / "compare"


def test_a_uri_storage_path_has_no_default_report_directory_and_the_error_names_the_callers_fix() -> None:
    cfg = load_config(None, ["storage_path=s3://bucket/runs", "name=demo"])
    with pytest.raises(StorageError, match=r"`rayft eval` writes only .*pass --output /a/local/dir"):
        default_report_dir(cfg, "eval", command="rayft eval", fix="pass --output /a/local/dir")
    with pytest.raises(StorageError, match=r"`rayft.api.evaluate` writes only .*pass model= and output_dir="):
        api.evaluate(cfg)
