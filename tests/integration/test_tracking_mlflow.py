"""Experiment tracking against real components: an ``mlflow server`` started here (SQLite backend,
local artifact root, free port), read back through ``MlflowClient``, and W&B in offline mode read
back from the files it writes.

One server serves the module; the last test kills it (an outage mid-run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.canaries import CANARIES, files_containing
from tests.support.faults import ENV_FAULTS
from tests.support.runs import read_metrics
from tests.support.servers import Server, mlflow_server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRACKER_CANARIES = {**CANARIES, "MLFLOW_TRACKING_TOKEN": "canary-mlflow-token-0a9b8c7d"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


def rayft(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rayft ARGS`` with this test's cache and the canary credentials in the environment."""
    full_env = {**os.environ, **TRACKER_CANARIES, "RAYFT_CACHE": str(tmp_path / "cache"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rayft", *args], check=False, cwd=REPO, env=full_env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def rayft_here(tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``rayft ARGS`` in this process (the CLI on the tests' shared Ray), in the environment of :func:`rayft`:
    for a command whose process is not what a test is about (no kill, no cold start)."""
    from click.testing import CliRunner

    from rayft.cli.main import cli

    for name, value in {**TRACKER_CANARIES, "RAYFT_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def train_config(tmp_path: Path, model_dir: Path, tracking_uri: str) -> Path:
    config = tmp_path / "train.yaml"
    config.write_text(
        f"""
name: tracked
storage_path: {tmp_path / "runs"}
model: {{name: {model_dir}}}
data:
  datasets: [{{path: "builtin:arithmetic", max_rows: 64}}]
  validation_fraction: 0.1
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 8, micro_batch_size: 4, learning_rate: 3.0e-3, save_steps: 2, eval_steps: 4}}
scaling: {{num_workers: 0}}
logging:
  tensorboard: false
  mlflow: {{tracking_uri: "{tracking_uri}", experiment: tracking-test, artifacts: [config, final],
           send_interval_s: 1}}
  wandb: {{project: rayft-test, mode: offline}}
"""
    )
    return config


def history(client: Any, run_id: str) -> dict[str, dict[int, float]]:
    """Every metric of the run as ``{key: {step: value}}``, failing on a step logged twice."""
    out: dict[str, dict[int, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        points = client.get_metric_history(run_id, key)
        steps = [p.step for p in points]
        assert len(steps) == len(set(steps)), f"{key}: a step appears twice: {sorted(steps)}"
        out[key] = {p.step: p.value for p in points}
    return out


def jsonl_history(run_dir: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for record in read_metrics(run_dir):
        for key, value in record.items():
            if key not in ("step", "time") and value is not None:
                out.setdefault(key, {})[record["step"]] = value
    return out


def test_train_killed_and_resumed_logs_one_run_without_duplicates(
    server: Server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import contextlib
    import threading

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    config = train_config(tmp_path, tiny_model_dir, server.uri)
    run_dir = tmp_path / "runs" / "tracked"
    client = MlflowClient(tracking_uri=server.uri)
    # SIGKILL in the save of step 6, before it commits: the resume restarts from step 4, and steps 5-6,
    # already sent, are computed again. The run is held before step 6 until the server has step 5.
    release = tmp_path / "step-5-sent"

    def release_once_step_5_is_sent() -> None:
        while not release.exists():
            # tracking.json may be mid-write, the run not created yet: look again
            with contextlib.suppress(OSError, ValueError, KeyError, MlflowException):
                run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
                if 5 in history(client, run_id).get("train/loss", {}):
                    release.touch()
            time.sleep(0.1)

    threading.Thread(target=release_once_step_5_is_sent, daemon=True).start()
    faults = {"RAYFT_FAULT_KILL_IN_SAVE": "6:before_commit", "RAYFT_FAULT_HOLD": f"6:{release}"}
    killed = rayft(tmp_path, ["train", str(config), ENV_FAULTS], faults)
    assert killed.returncode != 0
    assert release.exists(), "the run was killed before step 5 reached the server"
    ids = json.loads((run_dir / "tracking.json").read_text())
    before = history(client, ids["mlflow"]["run_id"])
    assert max(before["train/loss"]) >= 5, "the first attempt sent steps past the last checkpoint"

    resumed = rayft(tmp_path, ["train", str(config), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"] == ids["mlflow"], "the same run continues"

    run = client.get_run(ids["mlflow"]["run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "tracking-test"
    # Params: the resolved config as dotted keys; tags: version and data cache key.
    assert run.data.params["train.max_steps"] == "8" and run.data.params["lora.r"] == "4"
    assert run.data.params["logging.mlflow.tracking_uri"] == server.uri
    assert run.data.tags["rayft.version"] and len(run.data.tags["rayft.data_key"]) >= 8
    # The metric history: every step once, the same steps (and losses) as metrics.jsonl.
    tracked, written = history(client, run.info.run_id), jsonl_history(run_dir)
    assert set(tracked) == set(written) >= {"train/loss", "train/learning_rate", "train/grad_norm", "eval/loss"}
    for key, points in written.items():
        assert set(tracked[key]) == set(points), key
        timing = key in ("train/tokens_per_s", "checkpoint/save_seconds") or key.startswith("time/")
        if not timing:  # a recomputed step's loss is the same; its timings are not
            assert tracked[key] == pytest.approx(points, rel=1e-5), key
    assert sorted(tracked["train/loss"]) == list(range(1, 9))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "final"} <= artifacts
    final = {a.path for a in client.list_artifacts(run.info.run_id, "final")}
    assert "final/adapter_model.safetensors" in final

    # W&B offline: the same run id in both attempts; the resumed one starts after the checkpoint (step 4).
    from tests.support.wandb_files import read_offline_run

    offline = [read_offline_run(p) for p in sorted((run_dir / "wandb").rglob("run-*.wandb"))]
    assert len(offline) == 2 and offline[1].run_id == ids["wandb"]["run_id"]
    steps = [[row["_step"] for row in o.history if "train/loss" in row] for o in offline]
    # W&B writes what it buffered when it flushes: a SIGKILLed attempt keeps what was flushed, a prefix.
    assert steps[0] == list(range(1, len(steps[0]) + 1)) and offline[0].run_id in ("", ids["wandb"]["run_id"])
    assert steps[1] == [5, 6, 7, 8]
    resumed_losses = {row["_step"]: row["train/loss"] for row in offline[1].history if "train/loss" in row}
    assert resumed_losses == pytest.approx({s: written["train/loss"][s] for s in range(5, 9)}, rel=1e-5)
    assert offline[1].config["train.max_steps"] in (8, "8")
    assert any(tag.startswith("rayft.version=") for tag in offline[1].tags)

    # No credential reaches the tracker: not in its database, its artifacts, nor W&B's files.
    assert files_containing(server.directory, TRACKER_CANARIES) == []
    assert files_containing(run_dir, TRACKER_CANARIES) == []
    everything = json.dumps({"params": run.data.params, "tags": run.data.tags})
    assert not [name for name, value in TRACKER_CANARIES.items() if value in everything]


def test_pipeline_logs_a_parent_run_with_a_nested_run_per_stage(
    server: Server, ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"""
name: tracked-pipeline
storage_path: {tmp_path / "runs"}
model: {{name: {tiny_model_dir}}}
sdg:
  seeds: {{path: "builtin:arithmetic", max_rows: 8}}
  num_seeds: 8
  variations: 1
data:
  datasets:
    - {{path: "stage:sdg", format: template, input_template: "Q: {{question}}\\nA:", output_template: "{{answer}}"}}
  validation_fraction: 0.0
  max_seq_length: 128
lora: {{r: 4}}
train: {{max_steps: 2, micro_batch_size: 2, save_steps: 2}}
scaling: {{num_workers: 0}}
logging:
  tensorboard: false
  mlflow: {{tracking_uri: "{server.uri}", experiment: pipeline-test, artifacts: [config, eval, report]}}
eval:
  datasets: [{{path: "builtin:arithmetic", split: test, max_rows: 4}}]
  max_samples: 4
  batch_size: 4
  generation: {{max_new_tokens: 4}}
export: {{merge: true}}
"""
    )
    result = rayft_here(tmp_path, ["run", str(config)], monkeypatch)
    assert result.exit_code == 0, result.output[-4000:]
    run_dir = tmp_path / "runs" / "tracked-pipeline"
    ids = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=server.uri)
    parent = client.get_run(ids["run_id"])
    assert parent.info.status == "FINISHED"
    lineage = json.loads((run_dir / "lineage.json").read_text())
    for stage in lineage["stages"]:
        assert parent.data.tags[f"rayft.lineage.{stage['stage']}"] == stage["fingerprint"]
    assert {"pipeline.yaml", "report.html", "compare.json"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }

    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    by_stage = {c.data.tags["rayft.stage"]: c for c in children}
    assert set(by_stage) == {"sdg", "train", "eval", "export"} == set(ids["stages"])
    assert all(c.info.status == "FINISHED" for c in children)
    sdg = by_stage["sdg"].data.metrics
    assert sdg["rows.accepted"] > 0 and 0 < sdg["acceptance_rate"] <= 1
    train = by_stage["train"]
    assert [p.step for p in client.get_metric_history(train.info.run_id, "train/loss")] == [1, 2]
    assert any(key.startswith("verification.") for key in by_stage["export"].data.metrics), "export checks"
    evaluation = by_stage["eval"].data.metrics
    primary = f"models.tuned.metrics.{json.loads((run_dir / 'eval' / 'compare.json').read_text())['primary_metric']}"
    assert {f"{primary}.value", f"{primary}.ci_low", f"{primary}.ci_high"} <= set(evaluation), sorted(evaluation)
    assert any(key.startswith("pairs.0.") and key.endswith("diff_ci_low") for key in evaluation)


def test_unreachable_server_at_start_names_the_uri_or_warns(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    config = train_config(tmp_path, tiny_model_dir, dead)
    refused = rayft(tmp_path, ["train", str(config), "logging.wandb=null"])
    assert refused.returncode != 0
    assert f"MLflow server at {dead} is unreachable" in refused.stderr
    assert "logging.mlflow.required=false" in refused.stderr
    config.write_text(config.read_text().replace("name: tracked", "name: tracked-optional"))
    args = ["train", str(config), "logging.wandb=null", "logging.mlflow.required=false"]
    going_on = rayft_here(tmp_path, args, monkeypatch)
    assert going_on.exit_code == 0, going_on.output[-3000:]
    assert "the run goes on without MLflow" in going_on.output


def test_a_server_killed_mid_run_does_not_stop_training(server: Server, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Runs last: it kills the module's server."""
    import threading

    config = train_config(tmp_path, tiny_model_dir, server.uri)

    release = tmp_path / "server-killed"

    def kill_after_first_steps() -> None:
        """Once step 3 is logged (the run is held before step 4), kill the server, then let the run go on."""
        metrics = tmp_path / "runs" / "tracked" / "metrics.jsonl"
        while not release.exists():
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                server.kill()
                release.touch()
            time.sleep(0.05)

    killer = threading.Thread(target=kill_after_first_steps, daemon=True)
    killer.start()
    result = rayft(
        tmp_path, ["train", str(config), "logging.wandb=null", ENV_FAULTS], {"RAYFT_FAULT_HOLD": f"4:{release}"}
    )
    killer.join(5)
    assert server.process.poll() is not None, "the server was killed during the run"
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = tmp_path / "runs" / "tracked"
    assert sorted(jsonl_history(run_dir)["train/loss"]) == list(range(1, 9)), "metrics.jsonl has every step"
    unsent = json.loads((run_dir / "tracking-unsent.json").read_text())["MLflow"]["unsent_steps"]
    assert unsent and max(unsent) == 8
    assert "were not sent" in result.stderr and "they are in" in result.stderr
