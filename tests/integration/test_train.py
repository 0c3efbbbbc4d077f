"""Training on Ray Train with 2 workers (gloo, CPU) on a tiny random model: LoRA, gradient-accumulation
equivalence (one run on Ray's public path, without rayft._ray_private), and (slow tier) exact resume
after a worker is killed. Full fine-tuning on 2 workers: tests/integration/test_train_strategies.py
(its DDP run, the reference of the sharded ones)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.runs.manifest import read_manifest, verify_checkpoint
from tests.support.kills import kill_a_worker_at
from tests.support.ray_state import actor_classes, ray_processes, train_workers
from tests.support.runs import (
    RESUME_RUN,
    adapter_tensors,
    crashed_copy,
    read_metrics,
    tiny_config,
    train_losses,
    train_on,
)

pytestmark = pytest.mark.integration


@dataclass
class ThreadSeen:
    """A thread of a Ray Train worker as the watcher last saw it."""

    idle_once: bool  # under SCHED_IDLE at some sighting
    cpu_s: float


def _watch_worker_threads(
    stop: threading.Event, seen: dict[tuple[int, int], ThreadSeen], controllers: dict[int, bool]
) -> threading.Thread:
    """Until ``stop``, record every thread of the Ray Train workers (by process and thread id; the
    main thread's id is the process's): whether it ran under SCHED_IDLE, and its CPU time; and of
    every Ray Train controller, whether it ever had torch's library loaded."""
    import psutil

    since = time.time()

    def watch() -> None:
        while not stop.wait(0.05):
            for controller in ray_processes("ray::TrainController"):
                with contextlib.suppress(OSError):
                    maps = Path(f"/proc/{controller.pid}/maps").read_text()
                    controllers[controller.pid] = controllers.get(controller.pid, False) or "libtorch" in maps
            for process in train_workers(since):  # this run's, not another Ray's on the machine
                with contextlib.suppress(psutil.Error):
                    for thread in process.threads():
                        with contextlib.suppress(OSError):
                            idle = os.sched_getscheduler(thread.id) == os.SCHED_IDLE
                            key = (process.pid, thread.id)
                            was = seen.get(key)
                            cpu_s = thread.user_time + thread.system_time
                            seen[key] = ThreadSeen(idle or bool(was and was.idle_once), cpu_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def prepared(arithmetic_units: PreparedData) -> PreparedData:
    return arithmetic_units


def test_the_local_ray_starts_no_autoscaler_monitor(ray_session: None) -> None:
    import psutil
    import ray
    from ray._private import ray_constants

    # Started as rayft starts its own (rayft._ray_private.lean_head): the daemons training needs, not the monitor.
    node = ray._private.worker.global_worker.node
    started = set(node.all_processes)
    assert {ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET} <= started, started
    assert ray_constants.PROCESS_TYPE_DASHBOARD in started, "a driver joining this Ray needs it (see lean_head)"
    assert ray_constants.PROCESS_TYPE_MONITOR not in started, started
    commands = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True) if p.is_running()]
    assert not [c for c in commands if "autoscaler/_private/monitor.py" in c]
    assert ray.cluster_resources()["CPU"] == 2


def test_lora_on_two_workers(ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    before = actor_classes()
    threads: dict[tuple[int, int], ThreadSeen] = {}
    controllers: dict[int, bool] = {}
    stop = threading.Event()
    watcher = _watch_worker_threads(stop, threads, controllers)
    try:
        run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, "train.max_steps=6"), prepared)
    finally:
        stop.set()
        watcher.join(timeout=5)

    # On a Ray that rayft started, Ray Train runs without the helpers that cannot work there, and
    # without a dataset manager: the workers read their own rows of the prepared files.
    started = {name for _, name in actor_classes() - before}
    assert {"TrainController", "RayTrainWorker"} <= started
    assert not {"PlacementGroupCleaner", "PreemptionWatcher", "DatasetManager"} & started
    assert not {"_AutoscalingCoordinatorActor", "_StatsActor"} & started
    # Nor does its controller load torch (it only tells the workers what to run: rayft._ray_private.torch_config).
    assert controllers and not any(controllers.values()), controllers
    # Each worker's main thread (Ray's task loop) yields the CPU to training; the thread that trains
    # (the busiest of the others) never does. A thread Ray's main thread starts late would inherit its
    # policy, as intended for Ray's own work.
    if hasattr(os, "SCHED_IDLE"):
        workers = {pid for pid, tid in threads if tid != pid}  # not a child forked for a moment
        assert len(workers) == 2, threads
        for pid in workers:
            main = threads.get((pid, pid))
            assert main is not None and main.idle_once, threads
            others = [t for (p, tid), t in threads.items() if p == pid and tid != pid]
            trainer = max(others, key=lambda t: t.cpu_s)
            assert not trainer.idle_once, others
    losses = train_losses(run_dir)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    evals = [r["eval/loss"] for r in read_metrics(run_dir) if "eval/loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-000004", "step-000006"]  # num_to_keep=2: the best two, the latest among them
    for name in checkpoints:
        directory = run_dir / "checkpoints" / name
        assert verify_checkpoint(directory) == []
        manifest = read_manifest(directory)
        assert manifest is not None
        assert {"trainer/rng-rank-0000.pt", "trainer/rng-rank-0001.pt"} <= set(manifest.files)
    final = run_dir / "final"
    assert verify_checkpoint(final) == []
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    ids = tokenizer("Question: 2 + 2\nAnswer: ", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    assert (run_dir / "config.yaml").is_file() and (final / "rayft_config.yaml").is_file()


def test_gradient_accumulation_is_equivalent_and_so_is_rays_public_path(
    ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft._ray_private import SWITCH_ENV

    common = ("train.max_steps=4", "lora.dropout=0", "train.eval_steps=null", "train.save_steps=100")
    four_by_two = train_on(
        tiny_config(tiny_model_dir, tmp_path / "a", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2",
                    *common),
        prepared,
    )  # fmt: skip
    # The second run goes without Ray's internals: Ray Train's own helpers, Ray Data's own iterator.
    monkeypatch.setenv(SWITCH_ENV, "0")
    before = actor_classes()
    two_by_four = train_on(
        tiny_config(tiny_model_dir, tmp_path / "b", "train.micro_batch_size=2", "train.gradient_accumulation_steps=4",
                    *common),
        prepared,
    )  # fmt: skip
    assert {"PlacementGroupCleaner", "PreemptionWatcher"} <= {name for _, name in actor_classes() - before}

    a, b = train_losses(four_by_two), train_losses(two_by_four)
    assert a.keys() == b.keys() == {1, 2, 3, 4}
    # The same float32 gradient summed over other micro-batches: ~1e-6 relative apart, which Adam's
    # scale-free update passes on to the weights as ~1e-6 of lr = 3e-3 per step (see assert_close_runs in
    # test_train_strategies.py): rel 1e-5 on the losses, 1e-5 on the weights hold on any kernel path.
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), step
    weights_a, weights_b = adapter_tensors(four_by_two / "final"), adapter_tensors(two_by_four / "final")
    for name, tensor in weights_a.items():
        assert (tensor - weights_b[name]).abs().max() < 1e-5, name


# The default tiers kill a worker of this run with gradient accumulation on (tests/chaos/
# test_chaos_workers.py: the same bitwise check, plus the samples of each step); this plain case is slow.
@pytest.mark.slow
def test_resume_after_a_worker_is_killed_matches_an_uninterrupted_run(
    uninterrupted_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    reference = uninterrupted_run
    interrupted_dir = tmp_path / "killed" / "run"
    seen: list[int] = []
    watcher = kill_a_worker_at(interrupted_dir, 5, seen, monkeypatch)
    interrupted = train_on(tiny_config(tiny_model_dir, tmp_path / "killed", *RESUME_RUN), prepared)
    watcher.join(timeout=5)

    assert seen, "no worker was killed"
    assert interrupted == interrupted_dir
    assert train_losses(interrupted) == train_losses(reference)  # bitwise, every step
    resumed = [r for r in read_metrics(interrupted) if "train/loss" in r]
    assert [r["step"] for r in resumed] == list(range(1, 13))
    ref_weights, got_weights = adapter_tensors(reference / "final"), adapter_tensors(interrupted / "final")
    assert all(got_weights[name].equal(tensor) for name, tensor in ref_weights.items())


def test_bf16_frozen_layers_train_on_two_workers_and_resume_exactly(
    uninterrupted_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    # Rank 1 builds on the meta device and gets rank 0's bf16 weights from DDP's broadcast; a resume rebuilds them.
    settings = (*RESUME_RUN, "train.frozen_precision=bf16")
    finished = train_on(tiny_config(tiny_model_dir, tmp_path / "whole", *settings), prepared)
    crashed_copy(finished, tmp_path / "crashed", crashed_at=7)  # resumes from the checkpoint of step 6
    resumed = train_on(tiny_config(tiny_model_dir, tmp_path / "crashed", *settings), prepared, resume=True)
    losses = train_losses(finished)
    assert sorted(losses) == list(range(1, 13))
    assert train_losses(resumed) == losses  # bitwise, every step
    want = adapter_tensors(finished / "final")
    assert all(adapter_tensors(resumed / "final")[name].equal(t) for name, t in want.items())
    # The setting reached the workers: the same run with float32 products (the shared uninterrupted run, on
    # the same units) has other losses, close to these.
    fp32 = train_losses(uninterrupted_run)
    assert fp32 != losses
    # bf16 keeps 8 bits (a product's operands round within 2**-9): each frozen product moves by ~0.6% at most,
    # and the tiny model's loss with it; 5% is an accuracy bound over 12 steps, not an equality.
    assert all(fp32[step] == pytest.approx(losses[step], rel=0.05) for step in losses), (fp32, losses)
