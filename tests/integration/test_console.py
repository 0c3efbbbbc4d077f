"""What a user sees: `rayft run` on the console shows rayft's stage headers, training steps and
generation progress, and keeps Ray's progress logging and known noise in the run's log file; with
canary values in the credential variables, neither the console nor any file of the run holds one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CANARIES, files_containing

pytestmark = pytest.mark.integration

RAY_NOISE = (
    "Running Dataset",  # Ray Data's progress logging
    "Starting execution of Dataset",
    "Total Progress",
    "falling back to serialize",  # a column Ray Data could not store as Arrow
    "FutureWarning",
    "Reporting training result",  # Ray Train, per step and rank
    "Loading weights",  # Hugging Face progress bars
    "Started a local Ray instance",
)


def _config(tmp_path: Path, model_dir: Path) -> Path:
    config = tmp_path / "console.yaml"
    config.write_text(
        f"""
name: console
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
sdg:
  seeds: {{path: "builtin:arithmetic", max_rows: 8}}
  num_seeds: 8
  variations: 1
data:
  validation_fraction: 0.0
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 2, micro_batch_size: 2, save_steps: 2, logging_steps: 1}}
scaling: {{num_workers: 2}}
logging: {{tensorboard: false}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 4}}]
  batch_size: 2
  num_workers: 1
  generation: {{max_new_tokens: 4}}
"""
    )
    return config


def test_console_shows_rayft_progress_not_ray_logs(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, **CANARIES, "PYTHONUNBUFFERED": "1"}
    env.pop("RAYFT_VERBOSE", None)
    cmd = [sys.executable, "-m", "rayft", "run", str(_config(tmp_path, tiny_model_dir))]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console
    for header in ("== sdg: running", "== train: running", "== eval: running"):
        assert header in console
    assert "sdg symbolic: 8/8 seeds (100%)" in console
    assert re.search(r"step 2/2 +loss \d", console), console
    for label in ("base", "tuned"):
        assert re.search(rf"eval {label}: 4/4 prompts \(100%\), [\d.]+ prompts/s, .* eta", console), console
    assert "in-distribution check, not a GSM8K result" in console
    for noise in RAY_NOISE:
        assert noise not in console, f"{noise!r} reached the console:\n{console}"
    assert len(console.splitlines()) < 40, console
    log_file = tmp_path / "runs" / "console" / "logs" / "rayft.log"
    assert str(log_file) in console
    assert "Starting execution of Dataset" in log_file.read_text()  # Ray's logs are kept, in the file
    assert [name for name, value in CANARIES.items() if value in console] == []
    assert files_containing(tmp_path / "runs", CANARIES) == []
