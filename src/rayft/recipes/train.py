"""``rayft train CONFIG``: supervised fine-tuning of a causal LM on Ray Train.

Reads top to bottom: claim the run directory, start Ray, prepare the data once (cached), plan the
steps, run the workers, and collect what they wrote.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft import __version__
from rayft.config import RayftConfig, dump_config
from rayft.config.loader import read_yaml
from rayft.data.prepared import PreparedData
from rayft.errors import ConfigError, DataError, RunStateError, StorageError
from rayft.training import layout
from rayft.training.checkpoint_store import remove_incomplete, scan_checkpoints
from rayft.training.plan import Schedule, plan_schedule
from rayft.training.worker import WorkerPlan

log = logging.getLogger("rayft.train")

# Settings that may change when a run is resumed: they do not change what was already trained.
RESUMABLE_CHANGES = (
    "scaling.",
    "failure.",
    "logging.",
    "checkpoint.",
    "train.max_steps",
    "train.num_epochs",
    "train.eval_steps",
    "train.save_steps",
    "train.logging_steps",
    "train.early_stopping_patience",
)


@dataclass(frozen=True)
class TrainResult:
    """What a finished training run produced."""

    run_dir: Path
    final_dir: Path
    steps: int
    train_loss: float | None
    eval_loss: float | None
    data_key: str
    elapsed_s: float


def run(cfg: RayftConfig, *, resume: bool = False) -> TrainResult:
    """Fine-tune ``cfg.model`` on ``cfg.data`` and write the run directory."""
    from rayft.data.prepare import prepare_data
    from rayft.runtime import ray_runtime

    started = time.monotonic()
    run_dir = claim_run_dir(cfg, resume=resume)
    use_ray = cfg.scaling.num_workers > 0
    with ray_runtime(cfg.scaling.address) if use_ray else contextlib.nullcontext():
        prepared = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=run_dir / "data", use_ray=use_ray)
        plan = build_worker_plan(cfg, prepared, run_dir)
        launch(cfg, plan, prepared)
    return collect_result(run_dir, prepared, time.monotonic() - started)


def claim_run_dir(cfg: RayftConfig, *, resume: bool) -> Path:
    """Create (or reopen with ``resume``) the run directory and save the resolved config in it.

    Refuses to reuse a run's name without ``--resume``, and to resume with changed settings that
    would make the result a mix of two different runs.
    """
    if "://" in cfg.storage_path:
        raise StorageError(
            f"storage_path {cfg.storage_path!r}: remote URIs are not supported by `rayft train` here; "
            "use a local directory or a shared mount (for example /mnt/shared/runs)"
        )
    run_dir = Path(cfg.storage_path).expanduser().resolve() / cfg.name
    saved = run_dir / layout.CONFIG_FILE
    decide_run_start(run_dir, resume=resume)
    if resume:
        check_resumable(read_yaml(saved), cfg)
        remove_incomplete(run_dir / layout.CHECKPOINTS_DIR)
    _write_text(saved, dump_config(cfg))
    return run_dir


def decide_run_start(run_dir: Path, *, resume: bool) -> None:
    """Raise when starting (or resuming) this run directory is not allowed."""
    existing = (run_dir / layout.CONFIG_FILE).is_file()
    finished = (run_dir / layout.FINAL_DIR / "rayft_checkpoint.json").is_file()
    steps = [c.step for c in scan_checkpoints(run_dir / layout.CHECKPOINTS_DIR) if c.complete]
    where = f"{run_dir}"
    if resume and not existing:
        raise RunStateError(f"--resume: there is no run at {where} to resume; drop --resume to start it")
    if finished:
        raise RunStateError(
            f"run {run_dir.name!r} already finished ({where}/final exists); choose another name "
            f"(name={run_dir.name}-2) or delete {where}"
        )
    if existing and not resume:
        detail = f"checkpoints up to step {max(steps)}" if steps else "no checkpoint yet"
        raise RunStateError(
            f"run {run_dir.name!r} already exists at {where} ({detail}); rerun with --resume to continue it, "
            f"or choose another name (name={run_dir.name}-2)"
        )


def check_resumable(saved: dict[str, Any], cfg: RayftConfig) -> None:
    """Refuse a resume whose config differs from the saved one outside RESUMABLE_CHANGES."""
    before = _flatten(saved)
    after = _flatten(json.loads(cfg.model_dump_json()))
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


def build_worker_plan(cfg: RayftConfig, prepared: PreparedData, run_dir: Path) -> WorkerPlan:
    """Decide the step schedule and package everything the workers need."""
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
    from rayft.training.manifest import read_manifest

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
