"""``rayft train CONFIG``: supervised fine-tuning of a causal LM on Ray Train.

Reads top to bottom: claim the run directory (or the remote run and its local mirror), start Ray,
prepare the data once (cached), plan the steps, run the workers, and collect what they wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rayft import __version__
from rayft.config import RayftConfig, dump_config
from rayft.config.loader import read_yaml
from rayft.data.prepared import PreparedData
from rayft.errors import ConfigError, DataError, RunStateError, StorageError
from rayft.runs import layout
from rayft.runs.checkpoints import remove_incomplete, scan_checkpoints
from rayft.runs.location import RunLocation, plan_run_location
from rayft.runs.remote import RemoteRun, RunState
from rayft.training.plan import Schedule, plan_schedule
from rayft.training.worker_plan import WorkerPlan

log = logging.getLogger("rayft.train")

# Settings that may change when a run is resumed: they do not change what was already trained.
RESUMABLE_CHANGES = (
    "scaling.",
    "failure.",
    "logging.",
    "checkpoint.",
    "k8s.",  # where the job runs, not what it trains
    "train.strategy",  # checkpoints hold whole weights and name-keyed optimizer state under every strategy
    "train.max_steps",
    "train.num_epochs",
    "train.eval_steps",
    "train.save_steps",
    "train.logging_steps",
    "train.early_stopping_patience",
)


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
    """Fine-tune ``cfg.model`` on ``cfg.data`` and write the run directory.

    Args:
        cfg: The resolved config.
        resume: Continue the run of the same name from its newest complete checkpoint.
        mirror_dir: Where the local mirror of a remote run goes (default: under the cache).
    """
    from rayft.data.prepare import prepare_data
    from rayft.runtime import ray_runtime

    started = time.monotonic()
    location = run_location(cfg, mirror_dir)
    run_dir = claim_run_dir(cfg, resume=resume, location=location)
    use_ray = cfg.scaling.num_workers > 0
    with ray_runtime(cfg.scaling.address) if use_ray else contextlib.nullcontext():
        prepared = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=run_dir / "data", use_ray=use_ray)
        plan = build_worker_plan(cfg, prepared, run_dir, remote_uri=location.remote_uri)
        launch(cfg, plan, prepared)
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


def claim_run_dir(cfg: RayftConfig, *, resume: bool, location: RunLocation | None = None) -> Path:
    """Create (or reopen with ``resume``) the run directory and save the resolved config in it.

    Refuses to reuse a run's name without ``--resume``, and to resume with changed settings that
    would make the result a mix of two different runs. With a URI as ``storage_path`` the remote
    run decides, and the returned directory is its local mirror (see :func:`claim_remote_run`).
    """
    location = location or run_location(cfg)
    if location.remote_uri is not None:
        return claim_remote_run(cfg, location.local_dir, RemoteRun(location.remote_uri), resume=resume)
    run_dir = location.local_dir
    saved = run_dir / layout.CONFIG_FILE
    decide_run_start(str(run_dir), cfg.name, local_run_state(run_dir), resume=resume)
    if resume:
        check_resumable(read_yaml(saved), cfg)
        remove_incomplete(run_dir / layout.CHECKPOINTS_DIR)
    _write_text(saved, dump_config(cfg))
    return run_dir


def claim_remote_run(cfg: RayftConfig, mirror: Path, remote: RemoteRun, *, resume: bool) -> Path:
    """Start (or resume) a run whose durable home is a URI; return its local mirror.

    The URI is probed (a marker object written and deleted) before anything else. The mirror is a
    cache of the remote run and starts empty; on ``--resume`` the config is checked against the
    remote one, and the mirror receives the logs and the newest complete checkpoint that verifies,
    so a run continues on a machine that never saw it. The config is uploaded before training starts.
    """
    remote.probe()
    decide_run_start(remote.where.partition("?")[0], cfg.name, remote.run_state(), resume=resume)
    shutil.rmtree(mirror, ignore_errors=True)
    if resume:
        check_resumable(yaml.safe_load(remote.read_text(layout.CONFIG_FILE) or "") or {}, cfg)
        remote.remove_incomplete()
        remote.download_logs(mirror)
        remote.download_latest_checkpoint(mirror / layout.CHECKPOINTS_DIR)
    saved = mirror / layout.CONFIG_FILE
    _write_text(saved, dump_config(cfg))
    remote.upload_file(saved, layout.CONFIG_FILE)
    log.info("run %r: stored at %s, written through the local mirror %s", cfg.name, remote.where, mirror)
    return mirror


def local_run_state(run_dir: Path) -> RunState:
    """What a local run directory already holds."""
    finished = (run_dir / layout.FINAL_DIR / layout.MANIFEST_FILE).is_file()
    steps = tuple(c.step for c in scan_checkpoints(run_dir / layout.CHECKPOINTS_DIR) if c.complete)
    return RunState((run_dir / layout.CONFIG_FILE).is_file(), finished, steps)


def decide_run_start(where: str, name: str, state: RunState, *, resume: bool) -> None:
    """Raise when starting (or resuming) the run ``name`` stored at ``where`` is not allowed."""
    if resume and not state.exists:
        raise RunStateError(f"--resume: there is no run at {where} to resume; drop --resume to start it")
    if state.finished:
        raise RunStateError(
            f"run {name!r} already finished ({where}/final exists); choose another name "
            f"(name={name}-2) or delete {where}"
        )
    if state.exists and not resume:
        detail = f"checkpoints up to step {max(state.steps)}" if state.steps else "no checkpoint yet"
        raise RunStateError(
            f"run {name!r} already exists at {where} ({detail}); rerun with --resume to continue it, "
            f"or choose another name (name={name}-2)"
        )


def check_resumable(saved: dict[str, Any], cfg: RayftConfig) -> None:
    """Refuse a resume whose config differs from the saved one outside RESUMABLE_CHANGES."""
    before = _flatten(saved)
    after = _flatten(yaml.safe_load(dump_config(cfg)))  # masked as the saved one is
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    blocking = [k for k in changed if not k.startswith(RESUMABLE_CHANGES)]
    if blocking:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in blocking)
        raise ConfigError(
            f"--resume with a different config: {details}. Resume with the original settings, or start a new run "
            "under another name."
        )


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StorageError(
            f"storage_path: cannot write {path} ({exc.strerror}); choose a writable directory with storage_path=..."
        ) from exc


def build_worker_plan(
    cfg: RayftConfig, prepared: PreparedData, run_dir: Path, *, remote_uri: str | None = None
) -> WorkerPlan:
    """Decide the step schedule and package everything the workers need (``remote_uri``: where
    they upload checkpoints and final/ when ``storage_path`` is a URI)."""
    world = max(cfg.scaling.num_workers, 1)
    schedule = make_schedule(cfg, prepared, world)
    has_validation = prepared.validation is not None and prepared.validation.num_units >= world
    if prepared.validation is not None and not has_validation:
        log.warning(
            "validation has %d units, fewer than %d workers: no evaluation", prepared.validation.num_units, world
        )
    if cfg.train.early_stopping_patience and not has_validation:
        log.warning("train.early_stopping_patience is set but there is no validation data: it has no effect")
    lineage = {"data_key": prepared.key, "world_size": world, "rayft_version": __version__}
    return WorkerPlan(
        model=cfg.model, lora=cfg.lora, train=cfg.train, logging=cfg.logging, checkpoint=cfg.checkpoint,
        seed=cfg.seed, run_dir=str(run_dir), resolved_config=dump_config(cfg), schedule=schedule,
        shuffle_window=cfg.data.shuffle_buffer_size, has_validation=has_validation, lineage=lineage,
        remote_uri=remote_uri,
    )  # fmt: skip


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
    """Run the workers: in-process for ``num_workers: 0``, on Ray Train otherwise."""
    from rayft.training.launcher import launch_local, launch_ray

    if cfg.scaling.num_workers == 0:
        launch_local(plan, prepared, cfg.checkpoint, cfg.failure)
    else:
        launch_ray(plan, prepared, cfg.scaling, cfg.failure, cfg.checkpoint)


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
