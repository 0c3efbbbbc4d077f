"""Starting the workers: in this process (``num_workers: 0``) or as a Ray Train ``TorchTrainer``.

The workers are given the names of the prepared files, not their rows: each reads its own rows
(:mod:`rayft.training.loop.shards`), so the driver reads no training data and Ray's object store
holds no copy of a split.

Before Ray Train is asked for workers, the cluster is checked: a run that asks for more than the
cluster has fails within seconds with what is missing, instead of Ray Train's endless retries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rayft._ray_private import (
    GROUPS_DIR,
    local_train_env,
    placement_group_recorder,
    remove_orphaned_groups,
    remove_recorded_groups,
    torch_config,
    trainer_class,
)
from rayft.config.train import CheckpointConfig, FailureConfig, ScalingConfig
from rayft.console import ray_train_log_level
from rayft.data.prepared import PreparedData
from rayft.errors import ConfigError, ResourceError, RunInterruptedError
from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.stop import StopRequest
from rayft.runs.store import RunStore, open_store
from rayft.runtime import environment, local_idle_main_thread, owns_ray
from rayft.training.driver.restarts import decide_after_failure
from rayft.training.loop.entry import ray_worker_entry
from rayft.training.loop.heap import AllocatorPlan, find_jemalloc, plan_allocator, release_free_memory
from rayft.training.loop.plan import missing_resources
from rayft.training.loop.session import LocalSession
from rayft.training.loop.worker import run_worker
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.methods.registry import REGISTERED

if TYPE_CHECKING:
    import ray.train

log = logging.getLogger("rayft.train")


def split_files(prepared: PreparedData) -> dict[str, tuple[str, ...]]:
    """The parquet files of each split, in reading order."""
    files = {"train": prepared.train.files}
    if prepared.validation is not None and prepared.validation.num_units > 0:
        files["validation"] = prepared.validation.files
    return files


def launch_local(
    plan: WorkerPlan, prepared: PreparedData, checkpoint: CheckpointConfig, failure: FailureConfig | None = None
) -> None:
    """Run the worker loop in this process, without Ray."""
    session = LocalSession(split_files(prepared), plan.location, num_to_keep=checkpoint.num_to_keep)
    with stop_on_sigterm(plan.location, (failure or FailureConfig()).sigterm_grace_s):
        try:
            run_worker(plan, session, REGISTERED)
        finally:
            # This process goes on (to evaluate, generate, serve) while glibc keeps what the run's steps
            # freed: about 2.4 GiB after 10 SmolLM2-135M LoRA steps (docs/performance.md).
            gc.collect()
            release_free_memory()


@dataclasses.dataclass
class _StopRequest:
    requested: bool = False
    expired: bool = False
    timer: threading.Timer | None = None

    def interrupt(self, thread_id: int) -> None:
        """The grace period is over: interrupt the launch in the thread ``thread_id`` (the main one)."""
        self.expired = True
        # A real SIGINT: it also wakes a blocking wait (interrupt_main would not).
        signal.pthread_kill(thread_id, signal.SIGINT)


@contextlib.contextmanager
def stop_on_sigterm(location: RunLocation, grace_s: float) -> Iterator[None]:
    """On SIGTERM, ask the workers of the run at ``location`` to save a checkpoint and stop
    (:class:`StopRequest`: a file in the run directory and, for a run at a URI, a marker under the
    URI, which workers on other nodes poll), then raise :class:`RunInterruptedError` naming the
    saved checkpoint. If they have not finished within ``grace_s``, the launch is interrupted.

    Outside the main thread (where signals cannot be handled) this does nothing.
    """
    store = open_store(location)
    stop = StopRequest(location)
    stop.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    request = _StopRequest()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if request.requested:
            return
        request.requested = True
        log.warning("SIGTERM: saving a checkpoint and stopping within %g s (failure.sigterm_grace_s)", grace_s)
        stop.send()
        request.timer = threading.Timer(grace_s, request.interrupt, args=(threading.main_thread().ident,))
        request.timer.daemon = True
        request.timer.start()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    # The grace timer interrupts with SIGINT; make sure that raises KeyboardInterrupt here even when an
    # earlier launch in this process left another handler behind (Ray Train installs one per fit).
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except BaseException:
        # Once the grace ran out, whatever the interrupt became is the stop below: a KeyboardInterrupt, or,
        # inside a Ray Train fit (whose own SIGINT handler aborts the run instead), that handler's
        # SystemExit or the error of the aborted run.
        if not request.expired:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_sigint)
        if request.timer is not None:
            request.timer.cancel()
        stop.clear()
    if not request.requested or store.finished():
        return
    if request.expired:
        raise RunInterruptedError(
            f"SIGTERM: the workers did not save within failure.sigterm_grace_s={grace_s:g} s; the run stopped. "
            f"Rerun the same command with --resume to continue from {_latest_step_text(store)}."
        )
    raise RunInterruptedError(
        f"stopped on SIGTERM after saving {_latest_step_text(store)}; rerun the same command "
        "with --resume to continue from it"
    )


def _latest_step_text(store: RunStore) -> str:
    steps = [c for c in store.checkpoints() if c.complete]
    if not steps:
        return "the start (no checkpoint was committed)"
    latest = max(steps, key=lambda c: c.step)
    return f"checkpoint {store.where_of(f'{layout.CHECKPOINTS_DIR}/{latest.name}')} (step {latest.step})"


def worker_resources(scaling: ScalingConfig, use_gpu: bool) -> dict[str, float]:
    """Resources of one worker: the configured ones, defaulting to 1 CPU (and 1 GPU with use_gpu)."""
    resources = {"CPU": 1.0, **({"GPU": 1.0} if use_gpu else {})}
    resources.update(scaling.resources_per_worker)
    return resources


def resolve_use_gpu(setting: bool | str, cluster_resources: dict[str, float]) -> bool:
    """``auto`` uses GPUs when the cluster has any."""
    if setting == "auto":
        return cluster_resources.get("GPU", 0.0) > 0
    return bool(setting)


def check_cluster_fits(
    per_worker: dict[str, float], scaling: ScalingConfig, while_waiting: Callable[[], object] = lambda: None
) -> None:
    """Fail fast when the workers cannot be placed: first against the cluster's totals, then by
    reserving them for up to ``startup_timeout_s`` (other jobs may hold them), calling
    ``while_waiting`` about every second until they are reserved."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]
    problems = missing_resources(per_worker, scaling.num_workers, nodes)
    if problems:
        raise ResourceError(
            f"scaling: {scaling.num_workers} workers x {per_worker} do not fit this Ray cluster: "
            f"{'; '.join(problems)}. Lower scaling.num_workers or scaling.resources_per_worker, or add nodes."
        )
    group = placement_group([dict(per_worker)] * scaling.num_workers, strategy=scaling.placement_strategy)
    deadline = time.monotonic() + scaling.startup_timeout_s
    try:
        while not group.wait(timeout_seconds=max(0.1, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() < deadline:
                while_waiting()
                continue
            raise ResourceError(
                f"scaling: could not reserve {scaling.num_workers} workers x {per_worker} within "
                f"{scaling.startup_timeout_s:g} s; the cluster has {ray.available_resources()} free of "
                f"{ray.cluster_resources()}. Other jobs hold the rest: wait, or lower scaling.num_workers."
            )
    finally:
        remove_placement_group(group)


def launch_ray(
    plan: WorkerPlan,
    prepared: PreparedData,
    scaling: ScalingConfig,
    failure: FailureConfig,
    checkpoint: CheckpointConfig,
    *,
    callbacks: Sequence[Any] = (),
) -> None:
    """Run the worker loop on ``scaling.num_workers`` Ray Train workers and wait for the end
    (``callbacks``: Ray Train callbacks of the run, such as one that forwards its reports to Tune).

    A failed attempt (a worker killed, out of memory or lost with its node, Ray Train's controller
    killed, the worker group failing to start, a worker's error other than a rayft one) is followed
    by a new worker group that resumes from the latest checkpoint, up to ``failure.max_failures``
    times, with one line each on the console; Ray's own report goes to the run's log file."""
    import ray

    use_gpu = resolve_use_gpu(scaling.use_gpu, ray.cluster_resources())
    per_worker = worker_resources(scaling, use_gpu)
    own_ray = owns_ray()
    train_env = local_train_env(os.environ) if own_ray else {}
    allocator = workers_allocator(plan, local=own_ray)
    log.info("%s", allocator.note)
    store = open_store(plan.location)
    groups = plan.run_dir / GROUPS_DIR
    recorder = placement_group_recorder(str(groups))
    callbacks = (*callbacks, recorder) if recorder is not None else tuple(callbacks)
    with stop_on_sigterm(plan.location, failure.sigterm_grace_s), environment(train_env):
        for attempt in range(failure.max_failures + 1):
            # After a failed attempt: a killed controller leaves its workers' placement group to this job,
            # holding what the next attempt needs, and Ray marks it dead a moment after the failure shows.
            check_cluster_fits(per_worker, scaling, while_waiting=remove_orphans if attempt else lambda: None)
            trainer = build_trainer(
                plan, prepared, scaling, failure, checkpoint, use_gpu=use_gpu, per_worker=per_worker,
                callbacks=callbacks, worker_env=allocator.env_vars,
            )  # fmt: skip
            try:
                trainer.fit()
                return
            except Exception as exc:  # decided below: retried, translated, or raised as it is
                decide_after_failure(exc, failure, store, restarts=attempt)
            finally:  # whatever the outcome, the attempt's workers are done
                release_attempt(groups)
            remove_orphans()


def workers_allocator(plan: WorkerPlan, *, local: bool) -> AllocatorPlan:
    """The C allocator of this run's Ray Train workers (``train.allocator``, :func:`plan_allocator`), with
    jemalloc looked for on this machine."""
    jemalloc = find_jemalloc((sys.prefix, os.environ.get("CONDA_PREFIX", "")))
    train = plan.train
    try:
        return plan_allocator(
            train.allocator, train.malloc_mmap_threshold_bytes, os.environ, jemalloc,
            local=local, samples=train.traits.samples,
        )  # fmt: skip
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def release_attempt(groups: Path) -> None:
    """Remove the placement group of the attempt that just ended (recorded in ``groups``), with the
    workers still in it. Ray Train removes it itself, except when its shutdown of a failed worker
    group fails first (see :func:`rayft._ray_private.placement_group_recorder`): then the next
    attempt would wait for resources that nothing frees."""
    if remove_recorded_groups(groups):
        with contextlib.suppress(OSError):  # not empty, or gone: left as it is
            groups.rmdir()


def remove_orphans() -> None:
    """Remove the placement groups a killed Ray Train controller of this job left behind."""
    for group in remove_orphaned_groups():
        log.info("removed placement group %s of a failed attempt", group)


def build_trainer(
    plan: WorkerPlan,
    prepared: PreparedData,
    scaling: ScalingConfig,
    failure: FailureConfig,
    checkpoint: CheckpointConfig,
    *,
    use_gpu: bool,
    per_worker: dict[str, float],
    callbacks: Sequence[Any],
    worker_env: dict[str, str] | None = None,
) -> Any:  # a ray.train.torch.TorchTrainer: ray is imported here only, on the driver
    """One attempt's ``TorchTrainer``. Ray Train restarts nothing itself (its ``max_failures`` is
    0): the launcher does, because Ray Train cannot restart its own controller, the process Ray's
    memory monitor kills as readily as a worker."""
    import ray.train

    own_ray = owns_ray()
    return trainer_class(own_ray)(
        train_loop_per_worker=ray_worker_entry,
        train_loop_config={
            "plan": plan,
            "methods": REGISTERED,
            "files": split_files(prepared),  # each worker reads its own rows of them
            "idle_main_thread": own_ray and local_idle_main_thread(os.environ),
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=scaling.num_workers,
            use_gpu=use_gpu,
            resources_per_worker=per_worker,
            placement_strategy=scaling.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=layout.CHECKPOINTS_DIR,
            **ray_storage(plan),
            failure_config=ray.train.FailureConfig(max_failures=0),
            checkpoint_config=_ray_checkpoint_config(checkpoint, plan.has_validation),
            callbacks=list(callbacks),
            # set when each worker's process starts: a preloaded allocator (LD_PRELOAD) cannot come later
            worker_runtime_env={"env_vars": worker_env} if worker_env else None,
            # Ray Train's RunConfig takes it at run time; its typed v1 signature does not list it
            logging_config=ray.train.LoggingConfig(log_level=ray_train_log_level()),  # type: ignore[call-arg]
        ),
        torch_config=torch_config("nccl" if use_gpu else "gloo", int(failure.collective_timeout_s), deferred=own_ray),
    )


def ray_storage(plan: WorkerPlan) -> dict[str, Any]:
    """Ray Train's storage: the run directory, or, for a run at a URI, the URI itself (its
    filesystem and the path in it, so that no credential is part of a path Ray shows), which
    every node reaches."""
    path, filesystem = open_store(plan.location).checkpoint_storage()
    return {"storage_path": path, "storage_filesystem": filesystem}


def _ray_checkpoint_config(checkpoint: CheckpointConfig, has_validation: bool) -> ray.train.CheckpointConfig:
    import ray.train

    if has_validation:
        return ray.train.CheckpointConfig(
            num_to_keep=checkpoint.num_to_keep, checkpoint_score_attribute="eval/loss", checkpoint_score_order="min"
        )
    return ray.train.CheckpointConfig(num_to_keep=checkpoint.num_to_keep)
