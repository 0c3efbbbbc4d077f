"""A run at an ``s3://`` storage_path on a two-node Ray cluster (a ``ray start --head`` and a second
``ray start --address`` node on this machine, the local S3 server as the bucket), with rank 0 placed
on the second node by a custom resource. That node has a cache of its own; both nodes share this
machine's disk, so the test checks that nothing goes through it: rank 0 writes only under its own
node's cache, the driver's mirror never holds a checkpoint, SIGTERM reaches rank 0 through the URI,
and the resumed run continues from the checkpoint in the bucket after rank 0's node lost its files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import fault_callbacks
from tests.support.ray_head import RayHead, ray_head, ray_worker_node

pytestmark = pytest.mark.integration

RAYFT = str(Path(sys.executable).parent / "rayft")
STEPS = 8
SAVE_STEPS = 4


@pytest.fixture(scope="module")
def s3_server() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    from tests.support.object_store import local_s3_server

    with local_s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RayHead, Path]]:
    """The head (no custom resource) and a second node with ``second_node: 1`` and its own cache."""
    node_cache = tmp_path_factory.mktemp("second-node-cache")
    with (
        ray_head(num_cpus=1, dashboard=False) as head,
        ray_worker_node(head, num_cpus=1, resources={"second_node": 1}, env={"RAYFT_CACHE": str(node_cache)}),
    ):
        yield head, node_cache


def _rayft(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "RAY_ADDRESS": "", **env}
    return subprocess.Popen(
        [RAYFT, *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_rank_0_on_another_node_stores_and_resumes_the_run_through_s3(
    two_nodes: tuple[RayHead, Path], s3_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.runs.location import join_uri, plan_run_location, worker_dir
    from rayft.runs.remote import RemoteRun

    head, node_cache = two_nodes
    driver_cache = tmp_path / "driver-cache"
    uri = s3_server.bucket_uri("two-nodes", "runs")
    config = tmp_path / "two-nodes.yaml"
    config.write_text(
        f"name: spread\nstorage_path: '{uri}'\nmodel: {{name: {tiny_model_dir}}}\n"
        "data: {datasets: [{path: 'builtin:arithmetic', max_rows: 40}], validation_fraction: 0.0}\n"
        f"train: {{max_steps: {STEPS}, micro_batch_size: 4, save_steps: {SAVE_STEPS}}}\nlora: {{r: 4}}\n"
        f"scaling: {{num_workers: 1, address: '{head.gcs}', resources_per_worker: {{second_node: 1}}}}\n"
        "logging: {tensorboard: false}\n"
    )
    env = {**head.env, "RAYFT_CACHE": str(driver_cache)}
    remote = RemoteRun(join_uri(uri, "spread"))
    mirror = plan_run_location(uri, "spread", driver_cache).local_dir
    rank0_dir = worker_dir(join_uri(uri, "spread"), node_cache)

    # Held before the step after the first checkpoint until rank 0 sees the stop request, which only
    # the URI carries to it: the SIGTERM lands mid-run however fast the machine trains.
    # The fault rides in the config: rank 0 runs on the other node, whose workers do not see this environment.
    hold = {"RAYFT_FAULT_HOLD": f"{SAVE_STEPS + 1}:{tmp_path / 'never-released'}"}
    first = _rayft(["train", str(config), f"train.callbacks={json.dumps(fault_callbacks(hold))}"], env)
    # Until the first checkpoint is in the bucket, however long a cold start takes here.
    while not any(c.complete for c in remote.scan_checkpoints()):
        assert first.poll() is None, (first.communicate()[0] or "")[-3000:]
        time.sleep(0.3)
    first.send_signal(signal.SIGTERM)  # as `rayft jobs stop` does: save, then stop
    output = first.communicate(timeout=600)[0]  # a backstop against a hang, not a time limit
    assert first.returncode == 143, output[-3000:]
    assert "stopped on SIGTERM after saving checkpoint s3://" in output, output[-3000:]
    saved = max(c.step for c in remote.scan_checkpoints() if c.complete)
    assert saved == SAVE_STEPS + 1 and not remote.is_file("final/rayft_checkpoint.json")  # the step it was held at
    # Rank 0 wrote under its own node's cache; the driver's mirror never held a checkpoint.
    assert (rank0_dir / "checkpoints" / f"step-{saved:06d}" / "rayft_checkpoint.json").is_file()
    assert not (mirror / "checkpoints").exists() and not (driver_cache / "workers").exists()

    shutil.rmtree(rank0_dir)  # rank 0's node lost its disk: only the bucket holds the checkpoint
    second = _rayft(["train", str(config), "--resume"], env)
    output = second.communicate(timeout=600)[0]  # a backstop against a hang
    assert second.returncode == 0, output[-3000:]

    files = set(remote.list_files(""))
    assert {"config.yaml", "metrics.jsonl", "final/rayft_checkpoint.json", "final/adapter_model.safetensors"} <= files
    records = [json.loads(line) for line in (remote.read_text("metrics.jsonl") or "").splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, STEPS + 1))  # continued, no repeats
    assert not (mirror / "checkpoints").exists()
    assert not rank0_dir.exists()  # once final/ is uploaded, nothing of the run stays on rank 0's node
    # The driver's mirror got final/ from the bucket (rank 0 never wrote there).
    assert (mirror / "final" / "rayft_checkpoint.json").read_text() == remote.read_text("final/rayft_checkpoint.json")
    resumed_steps = [int(step) for step in re.findall(rf"step (\d+)/{STEPS}  loss", output)]
    assert resumed_steps and resumed_steps[0] == saved + 1, output[-3000:]  # from the checkpoint, not step 0
