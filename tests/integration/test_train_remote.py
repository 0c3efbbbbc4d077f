"""Training with an ``s3://`` storage_path (a local S3 server): checkpoints, metrics and final/ are
uploaded, a run whose machine is gone resumes from the remote checkpoint exactly, a pipeline keeps
its finished remote run, and a sweep's finished trials end TERMINATED with their final/ on the URI."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from rayft.runs.remote import RemoteRun
from tests.support.runs import RESUME_RUN, adapter_tensors, read_metrics, tiny_config, train_losses

pytestmark = pytest.mark.integration

# The session's uninterrupted run (12 steps, a checkpoint every 3, LoRA dropout on) is the reference;
# without retries, so that an injected failure ends the first attempt.
COMMON = (*RESUME_RUN, "failure.max_failures=0")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    from tests.support.object_store import local_s3_server

    with local_s3_server() as server:
        yield server


def train_remote(cfg: RayftConfig, prepared: PreparedData, *, resume: bool = False) -> Path:
    """The training driver's claim, launch and fetch of the results, with the run's URI handed to the
    workers; returns the mirror."""
    from rayft.runs.store import open_store
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_store, run_location

    store = open_store(run_location(cfg))
    run_dir = claim_store(cfg, store, resume=resume)
    default_launcher(cfg).launch(build_worker_plan(cfg, prepared, store.location), prepared)
    store.fetch_results()
    return run_dir


def remote_records(remote: RemoteRun) -> list[dict[str, Any]]:
    """The records of the run's metrics.jsonl under its URI."""
    return [json.loads(line) for line in (remote.read_text("metrics.jsonl") or "").splitlines()]


def test_a_run_on_s3_continues_on_a_fresh_machine_from_the_remote_checkpoint(  # noqa: PLR0917 - fixtures
    uninterrupted_run: Path, tiny_model_dir: Path, arithmetic_units: PreparedData, tmp_path: Path, s3_server: Any,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from rayft.training.driver.startup import run_location
    from tests.support.object_store import DUMMY_SECRET_KEY

    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    reference = uninterrupted_run
    uri = s3_server.bucket_uri("remote-train", "runs")
    cfg = tiny_config(tiny_model_dir, uri, *COMMON)
    remote = RemoteRun(run_location(cfg).remote_uri or "")

    monkeypatch.setenv("RAYFT_FAULT_RAISE", "0:7")
    with pytest.raises(Exception, match="injected failure on rank 0 at step 7"):
        train_remote(tiny_config(tiny_model_dir, uri, *COMMON), arithmetic_units)
    monkeypatch.delenv("RAYFT_FAULT_RAISE")
    # step 6's save runs in the background: the failure may cut its upload short (no manifest: incomplete)
    uploaded = [(c.step, c.complete) for c in remote.scan_checkpoints()]
    assert uploaded in ([(3, True), (6, True)], [(3, True), (6, False)], [(3, True)]), uploaded
    newest = max(step for step, complete in uploaded if complete)
    assert remote.is_file("config.yaml") and remote.is_file("metrics.jsonl")
    assert not remote.is_file("final/rayft_checkpoint.json")

    logged = {r["step"]: r["time"] for r in remote_records(remote) if "train/loss" in r}
    shutil.rmtree(tmp_path / "cache")  # the machine is gone; only the bucket remains
    caplog.set_level(logging.INFO, logger="rayft")
    mirror = train_remote(cfg, arithmetic_units, resume=True)

    # the steps up to the checkpoint are the records of the first attempt, the later ones new
    relogged = {r["step"]: r["time"] for r in remote_records(remote) if "train/loss" in r}
    assert all(relogged[step] == logged[step] for step in range(1, newest + 1))
    assert min(relogged[step] for step in range(newest + 1, 13)) > max(logged.values())
    assert train_losses(mirror) == train_losses(reference)  # the steps after the checkpoint continue exactly
    assert [r["step"] for r in read_metrics(mirror) if "train/loss" in r] == list(range(1, 13))
    ref_weights, got_weights = adapter_tensors(reference / "final"), adapter_tensors(mirror / "final")
    assert all(got_weights[name].equal(tensor) for name, tensor in ref_weights.items())

    files = set(remote.list_files(""))
    assert {"config.yaml", "metrics.jsonl", "final/rayft_checkpoint.json", "final/adapter_model.safetensors"} <= files
    assert sorted(c.name for c in remote.scan_checkpoints()) == ["step-000009", "step-000012"]  # num_to_keep=2
    assert all(f"checkpoints/{c}/rayft_checkpoint.json" in files for c in ["step-000009", "step-000012"])
    assert [r["step"] for r in remote_records(remote) if "train/loss" in r] == list(range(1, 13))
    assert DUMMY_SECRET_KEY not in (remote.read_text("config.yaml") or "")
    assert DUMMY_SECRET_KEY not in caplog.text
    final = tmp_path / "downloaded-final"
    remote.download_tree("final", final)
    downloaded = adapter_tensors(final)
    assert all(downloaded[name].equal(tensor) for name, tensor in ref_weights.items())


def test_rayft_run_trains_into_a_uri_and_keeps_the_finished_run_on_a_new_machine(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli
    from rayft.runs.location import join_uri

    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    uri = s3_server.bucket_uri("remote-pipeline", "runs")
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        f"name: p\nstorage_path: '{uri}'\nmodel: {{name: {tiny_model_dir}}}\n"
        "data: {datasets: [{path: 'builtin:arithmetic', max_rows: 32}], validation_fraction: 0.0, "
        "max_seq_length: 128}\n"
        "lora: {r: 4}\ntrain: {max_steps: 2, micro_batch_size: 2, save_steps: 1}\nscaling: {num_workers: 1}\n"
        "logging: {tensorboard: false}\n"
    )
    runner = CliRunner()
    first = runner.invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    pipeline = RemoteRun(join_uri(uri, "p"))
    files = set(pipeline.list_files(""))
    assert {"pipeline.yaml", "stages/train.json", "lineage.json", "report.html", "train/config.yaml",
            "train/metrics.jsonl", "train/final/rayft_checkpoint.json"} <= files, sorted(files)  # fmt: skip
    assert "train/checkpoints/step-000001/rayft_checkpoint.json" in files

    final = pipeline.read_text("train/final/rayft_checkpoint.json")

    shutil.rmtree(tmp_path / "cache")  # a new machine: the finished remote run is kept, not retrained
    again = runner.invoke(cli, ["run", str(config)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert pipeline.read_text("train/final/rayft_checkpoint.json") == final
    record = json.loads(pipeline.read_text("stages/train.json") or "{}")
    shown = record["summary"]["storage_uri"]
    assert record["summary"]["steps"] == 2 and "@remote-pipeline/runs/p/train?" in shown and "secret" not in shown


def test_a_fifo_sweep_on_s3_ends_its_finished_trials_terminated_with_final_on_the_uri(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli
    from rayft.runs.location import join_uri
    from rayft.security import mask_uri
    from tests.support.object_store import DUMMY_SECRET_KEY

    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    uri = s3_server.bucket_uri("remote-tune", "runs")
    config = tmp_path / "tune.yaml"
    config.write_text(
        f"name: sw\nstorage_path: '{uri}'\nmodel: {{name: {tiny_model_dir}}}\n"
        "data: {datasets: [{path: 'builtin:arithmetic', max_rows: 48}], validation_fraction: 0.2}\n"
        "lora: {r: 4}\ntrain: {max_steps: 4, micro_batch_size: 4, save_steps: 2, eval_steps: 2}\n"
        "scaling: {num_workers: 1}\nlogging: {tensorboard: false, console: false}\n"
        "tune: {scheduler: fifo, search_algorithm: grid,\n"
        "       search_space: {train.learning_rate: {grid: [1.0e-3, 3.0e-3]}}}\n"
    )
    swept = CliRunner().invoke(cli, ["tune", str(config)], catch_exceptions=False)
    assert swept.exit_code == 0, swept.output

    sweep_uri = join_uri(uri, "sw-tune")
    assert f"Sweep: {mask_uri(sweep_uri)}" in swept.output, swept.output
    assert DUMMY_SECRET_KEY not in swept.output
    assert "STOPPED_EARLY" not in swept.output, swept.output
    saved = json.loads(RemoteRun(sweep_uri).read_text("tune.json") or "{}")
    trials = saved["trials"]
    assert len(trials) == 2
    for trial in trials:
        assert trial["status"] == "TERMINATED", trial
        assert trial["stop_reason"] == "finished: trained all 4 steps" and trial["steps"] == 4, trial
        run = RemoteRun(join_uri(sweep_uri, "trials", trial["trial_id"]))
        assert run.is_file("final/rayft_checkpoint.json") and run.is_file("final/adapter_model.safetensors")
