"""One validator: every check a command makes of a whole config sits in one table
(:data:`rayft.config.checks.CHECKS`), and `rayft config validate` and the command refuse each of them
with the same one line, before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.config import load_config
from rayft.config.checks import CHECKS
from rayft.errors import RayftError
from rayft.pipeline import runner

# One config per check that it refuses, written as a user writes it (the sections a config names matter).
REFUSED: dict[str, tuple[dict, str]] = {  # type: ignore[type-arg]
    "a pipeline stage is named": ({"model": {"name": "m"}}, r"the config names no pipeline stage; add at least one"),
    "the stages named can run together": (
        {"train": {}, "rl": {}, "preference": {}},
        r"both an rl and a preference section: rayft run trains one of them after SFT; remove one",
    ),
    "the rl stage's sections are valid": (
        {"rl": {"train": {"learning_rate": -1}}},
        r"rl\.train\.learning_rate: Input should be greater than 0",
    ),
    "no train.rl or train.preference beside the stage that ignores it": (
        {"train": {"rl": {"group_size": 4}}, "rl": {}},
        r"train\.rl\.group_size: the rl stage trains with its own section's settings, so this one would be "
        r"ignored; move it to rl\.group_size",
    ),
    "every stage named can write to storage_path": (
        {"storage_path": "s3://bucket/runs?secret_key=SECRETVALUE123", "train": {}, "eval": {}},
        r"storage_path s3://bucket/runs: the eval stage\(s\) of `rayft run` write "
        r"only to a local directory",
    ),
}


def test_every_check_has_a_config_it_refuses() -> None:
    assert sorted(REFUSED) == sorted(check.name for check in CHECKS)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_validate_and_the_command_refuse_alike(name: str, tmp_path: Path) -> None:
    raw, message = REFUSED[name]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    (check,) = [c for c in CHECKS if c.name == name]
    for command in check.commands:
        validated = CliRunner().invoke(cli, ["config", "validate", str(path), "--command", command])
        assert validated.exit_code == 2, validated.output
        assert len([line for line in validated.output.splitlines() if line.startswith("Error:")]) == 1
        assert re.search(message, validated.output), validated.output
        assert "SECRETVALUE123" not in validated.output
    unasked = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert unasked.exit_code == (0 if check.asked_only else 2), unasked.output
    with pytest.raises(RayftError, match=message):  # what `rayft run` (and rayft.api.run_pipeline) runs
        runner.run(load_config(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]  # refused before anything was written


def test_several_problems_are_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"storage_path": "s3://b/r", "train": {}, "rl": {}, "preference": {}}))
    validated = CliRunner().invoke(cli, ["config", "validate", str(path)])
    assert validated.exit_code == 2
    assert "2 problem(s)" in validated.output and "both an rl and a preference" in validated.output
