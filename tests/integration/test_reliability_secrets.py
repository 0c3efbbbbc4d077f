"""Secrets never leak: with canary values in the credential variables, a full ``rayft train`` run
(2 Ray Train workers, tiny model) writes them nowhere: not in the run directory (config, metrics,
TensorBoard, checkpoints, final/), not in the Ray session directory (logs of every process), not
in the job's runtime environment as Ray stores it, not on the console."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CANARIES = {
    "HF_TOKEN": "hf_canaryHF0a1b2c3d4e5f",
    "WANDB_API_KEY": "canary-wandb-5f4e3d2c1b0a",
    "MLFLOW_TRACKING_PASSWORD": "canary-mlflow-9z8y7x6w",
    "AWS_ACCESS_KEY_ID": "AKIACANARY1234567890",
    "AWS_SECRET_ACCESS_KEY": "canary/aws+secret/0123456789abcdefABCDEF",
    "AWS_SESSION_TOKEN": "canary-aws-session-token-0123456789",
}


def files_containing(root: Path, needles: dict[str, str]) -> list[str]:
    """``path: VARIABLE`` for every file under ``root`` that contains a needle."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            hits += [f"{path}: {name}" for name, value in needles.items() if value.encode() in data]
    return hits


def test_a_full_run_writes_no_secret_anywhere(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(f"name: run\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's socket paths have a length limit
    stored = tmp_path / "ray-stored.json"
    overrides = ["scaling.num_workers=2", "train.max_steps=4", "train.save_steps=2", "train.eval_steps=2",
                 "lora.r=4", "data.datasets=[{path: 'builtin:arithmetic', max_rows: 64}]",
                 "data.validation_fraction=0.1", "data.max_seq_length=128"]  # fmt: skip
    env = {**os.environ, **CANARIES, "RAY_TMPDIR": str(ray_tmp), "RAYFT_CACHE": str(tmp_path / "cache")}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tests.integration.reliability_secrets_driver", str(stored), "train",
             str(config), *overrides],
            check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
        assert "Trained 4 steps" in result.stdout
        run_dir = tmp_path / "runs" / "run"
        assert (run_dir / "final" / "adapter_model.safetensors").is_file()
        assert list((run_dir / "checkpoints").glob("step-*")), "no checkpoint to inspect"
        sessions = list(ray_tmp.rglob("session_*"))
        assert sessions and list(ray_tmp.rglob("*.log")), "no Ray session logs to inspect"

        assert stored.is_file() and "runtime_env" in stored.read_text()
        assert files_containing(tmp_path, CANARIES) == []  # run dir, caches, what Ray stored of the job
        assert files_containing(ray_tmp, CANARIES) == []  # every Ray log and session file
        for name, value in CANARIES.items():
            assert value not in result.stdout + result.stderr, name
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
