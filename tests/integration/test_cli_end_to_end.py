"""The real ``rayft`` executable, as a user runs it (a subprocess, no Ray): ``rayft config show``,
``validate`` and ``fields`` print what they promise, and ``rayft compare`` of the base model and a
LoRA run writes its reports and prints its table, its paired tests and where the reports are."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration


def rayft(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rayft ARGS`` in a subprocess (this interpreter's rayft, the tests' PYTHONPATH)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rayft", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        f"name: cli\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n"
        "train:\n  learning_rate: 1.0e-4\n  max_steps: 7\n"
    )
    return path


def test_config_show_prints_the_resolved_config_with_defaults_yaml_and_overrides(config: Path) -> None:
    done = rayft("config", "show", str(config), "train.max_steps=9", "lora.r=4", cwd=config.parent)

    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["name"] == "cli" and shown["train"]["learning_rate"] == 1.0e-4  # from the file
    assert shown["train"]["max_steps"] == 9 and shown["lora"]["r"] == 4  # overrides win over the file
    assert shown["lora"]["dropout"] == 0.05  # a default, from no file
    again = config.parent / "shown.yaml"
    again.write_text(done.stdout)
    assert yaml.safe_load(rayft("config", "show", str(again), cwd=config.parent).stdout) == shown  # a fixed point


def test_config_validate_says_valid_and_fields_lists_a_section_with_its_help(config: Path) -> None:
    done = rayft("config", "validate", str(config), "train.save_steps=3", cwd=config.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{config}: valid\n"

    done = rayft("config", "fields", "train", cwd=config.parent)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    paths = [line.split(":", 1)[0] for line in lines[::2]]
    assert paths and all(path.startswith("train.") for path in paths), paths
    assert {"train.learning_rate", "train.max_steps", "train.save_steps", "train.strategy"} <= set(paths)
    assert all(line.startswith("    ") and line.strip() for line in lines[1::2])  # every field has its help
    every = rayft("config", "fields", cwd=config.parent).stdout.splitlines()[::2]
    assert {"model.name", "lora.r", "eval.max_samples"} <= {line.split(":", 1)[0] for line in every}


def test_compare_of_the_base_model_and_a_lora_run_writes_and_names_its_reports(
    config: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from tests.support.checkpoints import build_run_dir

    run_dir = build_run_dir(tmp_path / "runs" / "tuned", tiny_model_dir, eval_losses={2: 0.5, 4: 0.9})
    out = tmp_path / "cmp"
    done = rayft(
        "compare", str(config), "--model", f"base={tiny_model_dir}", "--model", f"tuned={run_dir}",
        "--output", str(out), "eval.runtime=local", "eval.max_samples=4", "eval.generation.max_new_tokens=4",
        "eval.bootstrap_samples=100", cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout
    for label in ("base", "tuned"):  # the table: a row per model and metric, n = 4
        assert re.search(rf"^{label} +accuracy_flexible +[\d.]+ +\[[\d.]+, [\d.]+\] +4$", table, re.M), table
    assert re.search(r"^tuned - base accuracy_flexible: [+-][\d.]+ .*, mcnemar p=", table, re.M), table
    for name in ("compare.html", "compare.md", "compare.json"):
        assert str(out / name) in done.stdout, done.stdout
    report = json.loads((out / "compare.json").read_text())
    assert set(report["models"]) == {"base", "tuned"} and report["num_examples"] == 4
    assert len((out / "examples.jsonl").read_text().splitlines()) == 4
    assert "# Comparison: base vs tuned" in (out / "compare.md").read_text()
