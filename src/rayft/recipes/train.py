"""``rayft train CONFIG``: supervised fine-tuning of a causal LM on Ray Train.

Reads top to bottom: claim the run directory (or the remote run and its local mirror), start Ray,
prepare the data once (cached), plan the steps, run the workers, and collect what they wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rayft._version import __version__
from rayft.config import RayftConfig, dump_config
from rayft.config.task import TaskConfig
from rayft.data.prepared import PreparedData
from rayft.errors import DataError, RunStateError
from rayft.models.resolve import anchored_name
from rayft.runs import layout
from rayft.runs.location import RunLocation, plan_run_location
from rayft.runs.lock import run_lock
from rayft.runs.planner import plan_train_start
from rayft.runs.store import open_store
from rayft.tracking.driver import start_training
from rayft.tracking.state import read_ids
from rayft.training.plan import Schedule, plan_schedule
from rayft.training.worker_plan import WorkerPlan

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


def run(cfg: RayftConfig, *, resume: bool = False, mirror_dir: Path | None = None) -> TrainResult:
    """Fine-tune ``cfg.model`` on ``cfg.data`` and write the run directory, holding its lock throughout.

    Args:
        cfg: The resolved config.
        resume: Continue the run of the same name from its newest complete checkpoint.
        mirror_dir: Where the local mirror of a remote run goes (default: under the cache).
    """
    from rayft.runtime import check_address, ray_is_initialized, ray_runtime

    started = time.monotonic()
    location = run_location(cfg, mirror_dir)
    use_ray = cfg.scaling.num_workers > 0
    if use_ray and cfg.scaling.address and not ray_is_initialized():
        check_address(cfg.scaling.address)  # before the run directory is claimed
    with run_lock(location.local_dir, command="rayft train"):
        run_dir = claim_run_dir(cfg, resume=resume, location=location)
        store = open_store(location)
        metrics = cfg.logging.prometheus.enabled
        with ray_runtime(cfg.scaling.address, metrics=metrics) if use_ray else contextlib.nullcontext():
            prepared = prepare_inputs(cfg, run_dir, use_ray=use_ray)
            store.persist(layout.DATA_DIR)
            plan = build_worker_plan(cfg, prepared, run_dir, remote_uri=location.remote_uri)
            trackers = start_training(cfg, run_dir, plan.lineage)
            # The tracker runs travel with the run (a resume elsewhere continues them) and with the plan.
            store.persist(layout.TRACKING_FILE)
            plan = dataclasses.replace(plan, tracker_ids=read_ids(run_dir))
            try:
                launch(cfg, plan, prepared)
            except BaseException:
                trackers.finish(succeeded=False)
                raise
        trackers.finish(
            succeeded=True, artifacts={"config": run_dir / layout.CONFIG_FILE, "final": run_dir / layout.FINAL_DIR}
        )
        result = collect_result(run_dir, prepared, time.monotonic() - started)
    if location.remote_uri is None:
        return result
    log.info("run stored at %s (local mirror %s)", location.display, run_dir)
    return dataclasses.replace(result, storage_uri=location.display)


def run_location(cfg: RayftConfig, mirror_dir: Path | None = None) -> RunLocation:
    """Where the run is written: its directory, or its URI and local mirror (``mirror_dir`` if given)."""
    from rayft.cache import cache_root

    location = plan_run_location(cfg.storage_path, cfg.name, cache_root())
    if location.remote_uri is not None and mirror_dir is not None:
        return RunLocation(mirror_dir, location.remote_uri)
    return location


def claim_run_dir(cfg: RayftConfig, *, resume: bool, location: RunLocation | None = None, retune: bool = False) -> Path:
    """Create (or reopen with ``resume``) the run's store and save the resolved config in it; return
    the directory training writes into (the run directory, or the local mirror of a remote run).

    Refuses to reuse a run's name without ``--resume``, and to resume with changed settings that
    would make the result a mix of two different runs (:func:`rayft.runs.planner.plan_train_start`).
    A URI is probed (a marker object written and deleted) before anything else. With ``retune``,
    a resume may also change the optimiser settings of :data:`rayft.runs.planner.RETUNABLE_CHANGES`.
    """
    store = open_store(location or run_location(cfg))
    store.probe()
    text = dump_config(cfg)
    plan = plan_train_start(
        store.where, cfg.name, store.state(), store.saved_config(), yaml.safe_load(text), resume=resume, retune=retune
    )
    store.begin(plan, text)
    log.info("run %r: %s at %s", cfg.name, plan.reason, store.where)
    return store.local_dir


def prepare_inputs(cfg: RayftConfig, run_dir: Path, *, use_ray: bool) -> PreparedData:
    """The training units: the tokenized data (prepared once, cached), or the example indices of
    a custom task (``task.path``), whose datasets the task builds here and again on every worker."""
    if cfg.task.path is None:
        from rayft.data.prepare import prepare_data

        return prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=run_dir / "data", use_ray=use_ray)
    from rayft.custom import load_task
    from rayft.training.objective import write_task_units

    task_cfg = worker_task(cfg)
    assert task_cfg is not None and task_cfg.path is not None
    data = load_task(task_cfg.path, task_cfg.options).build_datasets(cfg.seed)
    log.info("task %s: %d training and %d validation examples", cfg.task.path, len(data.train),
             len(data.validation or ()))  # fmt: skip
    return write_task_units(run_dir / "data" / "task-units", data, key=f"task:{cfg.task.path}")


def worker_task(cfg: RayftConfig) -> TaskConfig | None:
    """The custom task the workers run, its .py file made absolute (None for a causal LM)."""
    from rayft.custom import resolve_task_path

    if cfg.task.path is None:
        return None
    return cfg.task.model_copy(update={"path": resolve_task_path(cfg.task.path, Path.cwd())})


def with_worker_task(cfg: RayftConfig) -> RayftConfig:
    """``cfg`` with its custom task's .py file made absolute (unchanged without a task), for
    drivers that do not run in this working directory (the trials of a sweep)."""
    return cfg if cfg.task.path is None else cfg.model_copy(update={"task": worker_task(cfg)})


def build_worker_plan(
    cfg: RayftConfig, prepared: PreparedData, run_dir: Path, *, remote_uri: str | None = None
) -> WorkerPlan:
    """Decide the step schedule and package everything the workers need (``remote_uri``: where
    they upload checkpoints and final/ when ``storage_path`` is a URI)."""
    world = max(cfg.scaling.num_workers, 1)
    if cfg.task.path is None:  # a task's model and units are its own
        check_model_fits_data(cfg, prepared)
    schedule = make_schedule(cfg, prepared, world)
    has_validation = prepared.validation is not None and prepared.validation.num_units >= world
    if prepared.validation is not None and not has_validation:
        log.warning(
            "validation has %d units, fewer than %d workers: no evaluation", prepared.validation.num_units, world
        )
    if cfg.train.early_stopping_patience and not has_validation:
        log.warning("train.early_stopping_patience is set but there is no validation data: it has no effect")
    lineage = {
        "run": cfg.name, "data_key": prepared.key, "world_size": world, "rayft_version": __version__,
        "rejected_rows": int(prepared.stats.get("rejected_total", 0) or 0),
    }  # fmt: skip
    # workers run in another directory: a relative local model path is anchored here
    model = cfg.model.model_copy(update={"name": anchored_name(cfg.model.name)})
    return WorkerPlan(
        model=model, lora=cfg.lora, train=cfg.train, logging=cfg.logging, checkpoint=cfg.checkpoint,
        seed=cfg.seed, run_dir=str(run_dir), resolved_config=dump_config(cfg), schedule=schedule,
        shuffle_window=cfg.data.shuffle_buffer_size, has_validation=has_validation, lineage=lineage,
        remote_uri=remote_uri, task=worker_task(cfg),
    )  # fmt: skip


def check_model_fits_data(cfg: RayftConfig, prepared: PreparedData) -> None:
    """Refuse float16 for the model families that overflow in it, and units prepared for the other
    kind of model (causal sequences for an encoder-decoder, or source/target pairs for a causal LM)."""
    from rayft.models.architecture import refuse_fp16, resolve_architecture

    refuse_fp16(cfg.model, cfg.train.mixed_precision)
    seq2seq = resolve_architecture(cfg.model) == "seq2seq"
    if seq2seq != prepared.seq2seq:
        made, wanted = (
            ("source/target pairs", "a causal LM") if prepared.seq2seq else ("causal sequences", "an encoder-decoder")
        )
        raise DataError(
            f"data: the prepared dataset {prepared.root} holds {made}, but model.name={cfg.model.name!r} is {wanted}; "
            "prepare the data with this model (rayft data prepare with the same config), or set model.architecture"
        )


def make_schedule(cfg: RayftConfig, prepared: PreparedData, world: int) -> Schedule:
    """The step schedule, with a clear error when the data is too small for the workers."""
    try:
        schedule = plan_schedule(
            prepared.train.num_units, world, cfg.train.micro_batch_size,
            cfg.train.gradient_accumulation_steps, cfg.train.num_epochs, cfg.train.max_steps,
        )  # fmt: skip
    except ValueError as exc:
        raise DataError(f"data: {exc}") from None
    if schedule.dropped_units:
        log.warning(
            "%d of %d training units are left out of each epoch so that all %d workers get %d each",
            schedule.dropped_units, prepared.train.num_units, world, schedule.units_per_rank,
        )  # fmt: skip
    log.info(
        "plan: %d steps (%d per epoch), %d units per worker per epoch, %d workers",
        schedule.total_steps, schedule.steps_per_epoch, schedule.units_per_rank, world,
    )  # fmt: skip
    return schedule


def launch(cfg: RayftConfig, plan: WorkerPlan, prepared: PreparedData) -> None:
    """Run the workers: in-process for ``num_workers: 0``, on Ray Train otherwise. For a run at a
    URI, what the workers uploaded at the end (final/, metrics) is then fetched into the driver's
    mirror: rank 0 may have written it on another node."""
    from rayft.runs.remote import RemoteRun
    from rayft.training.launcher import launch_local, launch_ray

    if cfg.scaling.num_workers == 0:
        launch_local(plan, prepared, cfg.checkpoint, cfg.failure)
    else:
        launch_ray(plan, prepared, cfg.scaling, cfg.failure, cfg.checkpoint)
    if plan.remote_uri is not None:
        RemoteRun(plan.remote_uri).download_results(Path(plan.run_dir))


def collect_result(run_dir: Path, prepared: PreparedData, elapsed_s: float) -> TrainResult:
    """Summarise the run from what the workers wrote (final/ manifest and metrics.jsonl)."""
    from rayft.runs.manifest import read_manifest

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
