"""Fail fast, never hang (2-CPU local Ray): a run that asks for more CPUs, GPUs or memory than the
cluster has fails before Ray Train starts, naming what is missing and what the cluster has; a stuck worker ends
the run with a clear error within collective_timeout_s + 60 s and leaves no worker process or
placement group; a failure that repeats at the same step stops the run naming the rank and error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.errors import ResourceError, TrainingError
from tests.support.ray_state import actor_classes, train_workers
from tests.support.runs import read_metrics, tiny_config, train_on

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=32)


def leftovers(since: float) -> tuple[list[int], list[str]]:
    """Ray Train worker processes started at ``since`` or later (this test's, not those of another
    Ray on the machine) still alive, and placement groups of this Ray not yet removed."""
    import ray.util

    workers = [p.pid for p in train_workers(since)]
    groups = [g["placement_group_id"] for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    return workers, groups


def wait_until_clean(since: float, timeout_s: float = 30) -> tuple[list[int], list[str]]:
    deadline = time.monotonic() + timeout_s
    found = leftovers(since)
    while (found[0] or found[1]) and time.monotonic() < deadline:
        time.sleep(0.5)
        found = leftovers(since)
    return found


OVERSIZED = {
    "cpu": (("scaling.num_workers=3",), r"CPU: 3 needed, 2 in the cluster"),
    "gpu": (("scaling.use_gpu=true",), r"GPU: 2 needed, 0 in the cluster"),
    "memory": (
        ("scaling.resources_per_worker={CPU: 1, memory: 1099511627776}",),
        r"memory: 2048.0 GiB needed, [\d.]+ GiB in the cluster",
    ),
}


@pytest.mark.parametrize("resource", sorted(OVERSIZED))
def test_asking_for_more_than_the_cluster_has_fails_before_ray_train_starts(
    ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, resource: str
) -> None:
    overrides, message = OVERSIZED[resource]
    before = actor_classes()
    with pytest.raises(ResourceError, match=message):
        train_on(tiny_config(tiny_model_dir, tmp_path, *overrides), prepared)
    # Fails fast: refused before Ray Train started anything that could wait for resources (however
    # long this machine takes to get there), so nothing waits and nothing is left to clean up.
    started = {name for _, name in actor_classes() - before}
    assert not {"TrainController", "RayTrainWorker"} & started, started


def test_a_stuck_worker_ends_the_run_within_the_timeout_and_leaves_nothing_behind(
    ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYFT_FAULT_HANG", "1:3")  # rank 1 sleeps forever before step 3
    cfg = tiny_config(tiny_model_dir, tmp_path, "train.max_steps=6", "train.eval_steps=null",
                      "failure.collective_timeout_s=10", "failure.max_failures=0")  # fmt: skip
    hang_started: list[float] = []

    def watch() -> None:
        metrics = tmp_path / "run" / "metrics.jsonl"
        while not hang_started:
            if metrics.exists() and any(r["step"] == 2 for r in read_metrics(tmp_path / "run")):
                hang_started.append(time.monotonic())
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    since = time.time()
    with pytest.raises(TrainingError, match=r"collective timed out on rank 0 .*failure.collective_timeout_s=10"):
        train_on(cfg, prepared)
    assert hang_started, "the run never reached the stuck step"
    assert time.monotonic() - hang_started[0] < 10 + 60
    assert wait_until_clean(since) == ([], [])


def test_a_failure_repeating_at_the_same_step_stops_the_run_naming_rank_and_error(
    ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYFT_FAULT_RAISE", "1:3")  # on every attempt
    cfg = tiny_config(tiny_model_dir, tmp_path, "train.max_steps=6", "train.eval_steps=null",
                      "failure.max_failures=1")  # fmt: skip
    expected = r"training failed on rank 1 after 1 restart\(s\).*RuntimeError: injected failure on rank 1 at step 3"
    since = time.time()
    with pytest.raises(TrainingError, match=expected):
        train_on(cfg, prepared)
    assert wait_until_clean(since) == ([], [])
