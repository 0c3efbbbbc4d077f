"""`rayft train CONFIG` started by torchrun, as the Kubeflow TrainJob and PyTorchJob run it (2 processes, gloo):
it trains through the same driver as on Ray, so it logs to MLflow as a Ray run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayft.config import dump_config
from rayft.runs.lock import run_lock
from rayft.runs.manifest import read_manifest
from tests.support.runs import read_metrics, tiny_config

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
SRC = Path(__file__).resolve().parents[2] / "src"


def torchrun_train(config: Path, *extra: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node 2 --no-python rayft train CONFIG`, as the rendered manifests run it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--no-python", str(BIN / "rayft"), "train",
               str(config), *extra]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def write_config(tmp_path: Path, model_dir: Path, *overrides: str) -> Path:
    data = tmp_path / "rows.jsonl"
    rows = [{"instruction": f"Add {i} and {i + 3}.", "input": "", "output": f"{2 * i + 3}"} for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tiny_config(
        model_dir, tmp_path / "runs", f"data.datasets=[{{path: {data}, format: alpaca}}]",
        "data.validation_fraction=0.2", "train.max_steps=4", "train.micro_batch_size=2", *overrides,
    )  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    return path


def test_rayft_train_under_torchrun_trains_logs_to_mlflow_and_refuses_a_finished_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from tests.support.servers import mlflow_server

    with mlflow_server(tmp_path / "mlflow") as server:
        tracked = (f"logging.mlflow={{tracking_uri: '{server.uri}', experiment: torchrun-test, "
                   "artifacts: [config, final], send_interval_s: 1}")  # fmt: skip
        config = write_config(tmp_path, tiny_model_dir, tracked)
        run_dir = trains_once_and_refuses_a_second_job(config, tmp_path)
        client = MlflowClient(tracking_uri=server.uri)
        ids = json.loads((run_dir / "tracking.json").read_text())
        run = client.get_run(ids["mlflow"]["run_id"])
        assert run.info.status == "FINISHED" and run.data.params["train.max_steps"] == "4"
        assert run.data.tags["rayft.version"] and run.data.tags["rayft.data_key"]
        assert [p.step for p in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2, 3, 4]
        assert {"config.yaml", "final"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
        assert len(client.search_runs([run.info.experiment_id])) == 1  # one run for the job, not one per rank


def trains_once_and_refuses_a_second_job(config: Path, tmp_path: Path) -> Path:
    """Refused while another driver holds the run, trained, then refused as finished; the run directory."""
    with run_lock(tmp_path / "runs" / "run", command="another driver"):  # a second job on the same run is refused
        held = torchrun_train(config)
    assert held.returncode != 0
    assert f"pid {os.getpid()}" in held.stderr, held.stderr[-4000:]
    done = torchrun_train(config)
    assert done.returncode == 0, done.stderr[-4000:]
    run_dir = tmp_path / "runs" / "run"
    manifest = read_manifest(run_dir / "final")
    assert manifest is not None and manifest.step == 4
    steps = [r["step"] for r in read_metrics(run_dir) if "train/loss" in r]
    assert steps == [1, 2, 3, 4]
    assert (run_dir / "checkpoints" / "step-000004").is_dir()
    assert "Trained 4 steps" in done.stdout  # rank 0 reports, once
    assert done.stdout.count("Trained") == 1
    again = torchrun_train(config)  # a finished run is refused on every rank, not left waiting
    assert again.returncode != 0
    assert "already finished" in again.stderr
    return run_dir
