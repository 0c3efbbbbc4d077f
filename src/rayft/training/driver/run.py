"""The one training driver: lock, claim, data, plan, trackers, launch, results, in that order.

``rayft train`` (:mod:`rayft.recipes.train`), each trial of a sweep (:mod:`rayft.tuning.trial`),
``rayft train`` under torchrun (:mod:`rayft.training.driver.torchrun`) and the pipeline's train stage all
call :func:`drive`. What differs between them is passed in: how the run starts (a fixed
:class:`RunStart`, or a decision taken under the lock, as a trial does), the :class:`Launcher` that
runs the workers (in this process, on Ray Train, forwarding reports to Tune, or as torchrun's rank
0), the MLflow run the tracker run nests under, and the name on the lock. The store and the
trackers are seams as well (:class:`DriverSeams`), so the sequence is unit-tested with fakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, overload

from rayft.config import RayftConfig
from rayft.config.tracking import MlflowArtifact
from rayft.config.train import CheckpointConfig, FailureConfig, ScalingConfig
from rayft.data.prepared import PreparedData
from rayft.errors import RunStateError
from rayft.models.resolve import sources_resolved_once
from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.lock import run_lock
from rayft.runs.manifest import read_manifest
from rayft.runs.store import RunStore, open_store
from rayft.runtime import check_address, ray_is_initialized, ray_runtime
from rayft.tracking.driver import nested_under, start_training
from rayft.tracking.state import read_ids
from rayft.training.driver.launcher import launch_local, launch_ray
from rayft.training.driver.startup import (
    build_worker_plan,
    check_resume_data_unchanged,
    check_rollout_fits,
    check_rollout_length,
    claim_store,
    prepare_inputs,
)
from rayft.training.loop.worker_plan import WorkerPlan

log = logging.getLogger("rayft.train")


@dataclass(frozen=True)
class TrainResult:
    """What a finished training run produced.

    ``run_dir`` and ``final_dir`` are local: the run directory, or its mirror when ``storage_path``
    is a URI; ``storage_uri`` is then the run's durable home (credentials masked).
    """

    run_dir: Path
    final_dir: Path
    steps: int
    train_loss: float | None
    eval_loss: float | None
    data_key: str
    elapsed_s: float
    storage_uri: str | None = None


@dataclass(frozen=True)
class RunStart:
    """How the run is claimed: afresh, or continued (``resume``); ``retune`` lets a continued run
    change its optimiser settings (a trial continuing another trial's checkpoint, PBT)."""

    resume: bool = False
    retune: bool = False


StartDecision = Callable[[RunStore], "RunStart | None"]
"""Decides under the run's lock how it starts, from what its store holds; None: nothing to train
(a trial whose run had already finished)."""


class Launcher(Protocol):
    """Runs the workers of a planned run and waits for them to end: the driver's worker-group seam."""

    @property
    def uses_ray(self) -> bool:
        """Whether the data is prepared with Ray Data (Ray runs in :meth:`runtime`)."""

    def check(self) -> None:
        """Refuse, before the run is claimed, what would stop the launch (a Ray address that does not answer)."""

    def runtime(self) -> AbstractContextManager[Any]:
        """The context the data preparation and the launch run in (the Ray this launch needs)."""

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        """Run the workers on ``plan`` and return when they have finished."""


class Trackers(Protocol):
    """The tracker runs of one training run, as :func:`rayft.tracking.driver.start_training` opens them."""

    def finish(self, *, succeeded: bool, artifacts: dict[MlflowArtifact, Path] | None = None) -> None:
        """Report, upload the artifacts, end the runs; never raises."""


StartTrackers = Callable[[RayftConfig, Path, dict[str, Any], "str | None"], Trackers]
"""Opens the run's trackers: (config, run directory, lineage, parent MLflow run id)."""


def start_trackers(cfg: RayftConfig, run_dir: Path, lineage: dict[str, Any], parent_run_id: str | None) -> Trackers:
    """The trackers of :mod:`rayft.tracking.driver`, the MLflow run nested under ``parent_run_id``."""
    with nested_under(parent_run_id):
        return start_training(cfg, run_dir, lineage)


@dataclass(frozen=True)
class DriverSeams:
    """The driver's collaborators that tests replace with fakes: the run's store and its trackers."""

    open_store: Callable[[RunLocation], RunStore] = open_store
    start_trackers: StartTrackers = start_trackers


@overload
def drive(
    cfg: RayftConfig,
    launcher: Launcher,
    location: RunLocation,
    *,
    start: RunStart = ...,
    command: str = ...,
    parent_run_id: str | None = ...,
    seams: DriverSeams = ...,
) -> TrainResult: ...


@overload
def drive(
    cfg: RayftConfig,
    launcher: Launcher,
    location: RunLocation,
    *,
    start: StartDecision,
    command: str = ...,
    parent_run_id: str | None = ...,
    seams: DriverSeams = ...,
) -> TrainResult | None: ...


def drive(
    cfg: RayftConfig,
    launcher: Launcher,
    location: RunLocation,
    *,
    start: RunStart | StartDecision = RunStart(),
    command: str = "rayft train",
    parent_run_id: str | None = None,
    seams: DriverSeams = DriverSeams(),
) -> TrainResult | None:
    """Train ``cfg`` at ``location`` under its lock, from the claim to the downloaded results.

    Args:
        cfg: The resolved config.
        launcher: Runs the workers (:class:`LocalLauncher`, :class:`RayLauncher`, or a caller's own).
        location: Where the run lives (:func:`rayft.training.driver.startup.run_location`).
        start: How the run is claimed, or a decision taken under the lock (None: return None at once).
        command: The command named on the lock (shown to a second command on the same run).
        parent_run_id: The MLflow run the training run nests under (a sweep's, for its trials).
        seams: The store and trackers (fakes in tests).
    """
    started = time.monotonic()
    launcher.check()
    check_rollout_length(cfg)  # what the model can take, before the run is claimed
    # The data, the plan and the checks ask for the model's source: resolved once for the whole run.
    with sources_resolved_once(), run_lock(location.local_dir, command=command):
        store = seams.open_store(location)
        opening = start(store) if callable(start) else start
        if opening is None:
            return None
        run_dir = claim_store(cfg, store, resume=opening.resume, retune=opening.retune)
        with launcher.runtime():
            check_rollout_fits(cfg)  # what the cluster can hold, before the data
            prepared = prepare_inputs(cfg, run_dir, use_ray=launcher.uses_ray)
            check_resume_data_unchanged(store, prepared, cfg.checkpoint.resume_data_change)
            store.persist(layout.DATA_DIR)
            plan = build_worker_plan(cfg, prepared, store.location)
            trackers = seams.start_trackers(cfg, run_dir, plan.lineage, parent_run_id)
            # The tracker runs travel with the run (a resume elsewhere continues them) and with the plan.
            store.persist(layout.TRACKING_FILE)
            plan = dataclasses.replace(plan, tracker_ids=read_ids(run_dir), retuned=opening.retune)
            run_workers(launcher, plan, prepared, store, trackers)
        artifacts: dict[MlflowArtifact, Path] = {
            "config": run_dir / layout.CONFIG_FILE,
            "final": run_dir / layout.FINAL_DIR,
        }
        if (run_dir / layout.PROFILE_DIR).is_dir():
            artifacts["profile"] = run_dir / layout.PROFILE_DIR
        trackers.finish(succeeded=True, artifacts=artifacts)
        result = collect_result(run_dir, prepared, time.monotonic() - started)
    return dataclasses.replace(result, storage_uri=store.shown_uri)


def run_workers(
    launcher: Launcher, plan: WorkerPlan, prepared: PreparedData, store: RunStore, trackers: Trackers
) -> None:
    """Launch the workers and bring what they wrote at the end into ``store.local_dir`` (rank 0 may
    have uploaded it from another node); a failure ends the tracker runs as failed."""
    try:
        launcher.launch(plan, prepared)
        store.fetch_results()
    except BaseException:
        trackers.finish(succeeded=False)
        raise


def collect_result(run_dir: Path, prepared: PreparedData, elapsed_s: float) -> TrainResult:
    """Summarise the run from what the workers wrote (final/ manifest and metrics.jsonl)."""
    final = run_dir / layout.FINAL_DIR
    manifest = read_manifest(final)
    if manifest is None:
        raise RunStateError(f"training ended without writing {final}; see the log above for the cause")
    return TrainResult(
        run_dir=run_dir,
        final_dir=final,
        steps=manifest.step,
        train_loss=manifest.metrics.get("train/loss"),
        eval_loss=manifest.metrics.get("eval/loss"),
        data_key=prepared.key,
        elapsed_s=elapsed_s,
    )


@dataclass(frozen=True)
class LocalLauncher:
    """The worker loop in this process, without Ray (``scaling.num_workers: 0``)."""

    checkpoint: CheckpointConfig
    failure: FailureConfig
    uses_ray: bool = False
    actors_address: str | None = None  # GRPO's generation actors need a Ray (this one, or a local one)
    needs_actors: bool = False

    def check(self) -> None:
        """Nothing to check."""

    def runtime(self) -> AbstractContextManager[Any]:
        """No Ray, unless GRPO's rollouts run on generation actors: then the Ray this process uses, the
        cluster at ``scaling.address``, or a local one."""
        return ray_runtime(self.actors_address) if self.needs_actors else contextlib.nullcontext()

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        """Run the loop here."""
        launch_local(plan, prepared, self.checkpoint, self.failure)


@dataclass(frozen=True)
class RayLauncher:
    """The workers as a Ray Train ``TorchTrainer`` on the Ray at ``address`` (or one started here,
    with its metrics collected when ``metrics``); ``callbacks`` are Ray Train callbacks of the run,
    such as one that forwards its reports to Tune."""

    scaling: ScalingConfig
    failure: FailureConfig
    checkpoint: CheckpointConfig
    metrics: bool = False
    callbacks: tuple[Any, ...] = ()
    uses_ray: bool = True

    def check(self) -> None:
        """The cluster at ``scaling.address`` answers (unless this process already uses a Ray)."""
        if self.scaling.address and not ray_is_initialized():
            check_address(self.scaling.address)

    def runtime(self) -> AbstractContextManager[Any]:
        """The Ray this process already uses, the cluster at ``scaling.address``, or a local one."""
        return ray_runtime(self.scaling.address, metrics=self.metrics)

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        """Fit the trainer and wait for it."""
        launch_ray(plan, prepared, self.scaling, self.failure, self.checkpoint, callbacks=self.callbacks)


def default_launcher(cfg: RayftConfig) -> Launcher:
    """The launcher of ``rayft train``: in this process for ``num_workers: 0``, else on Ray Train."""
    if cfg.scaling.num_workers == 0:
        actors = cfg.train.traits.samples and cfg.train.rl.rollout.placement == "actors"
        return LocalLauncher(cfg.checkpoint, cfg.failure, actors_address=cfg.scaling.address, needs_actors=actors)
    return RayLauncher(cfg.scaling, cfg.failure, cfg.checkpoint, metrics=cfg.logging.prometheus.enabled)
