"""Generation actors that ask for more than the cluster has are refused as soon as the run's Ray is up,
with what they need and what the cluster has, instead of waiting out train.rl.rollout.start_timeout_s
while Ray's autoscaler repeats that it cannot place them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rayft

pytestmark = pytest.mark.integration


def test_actors_asking_more_cpus_than_the_cluster_has_are_refused_up_front(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "data.jsonl").write_text('{"prompt": "1 + 1 =", "completion": " 2"}\n' * 8)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"name: actors\nstorage_path: {tmp_path / 'runs'}\nmodel: {{name: {tiny_model_dir}}}\n"
        f"scaling: {{num_workers: 0}}\ndata: {{datasets: [{{path: {tmp_path / 'data.jsonl'}}}], packing: false}}\n"
        "train:\n  objective: grpo\n  max_steps: 1\n  rl:\n    rollout: {placement: actors, num_cpus_per_actor: 64}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(rayft.__file__).parents[1]), "HF_HUB_OFFLINE": "1",
           "RAYFT_CACHE": str(tmp_path / ".cache")}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rayft", "train", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert "1 generation actor(s) x {'CPU': 64.0} cannot be placed: CPU: 64 needed" in errors[0], errors[0]
    assert "train.rl.rollout.num_cpus_per_actor" in errors[0]
    assert elapsed < 120, f"{elapsed:.0f} s: the refusal waited for the actors' start timeout"
