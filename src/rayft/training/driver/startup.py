"""What a training driver decides and prepares before its workers start: where the run lives, the
claim of its store (with the resolved config saved in it), its training units, and the worker plan.

Every training driver (:func:`rayft.training.driver.run.drive`) and the sweep's preparation use these;
they are library functions, not a recipe.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import replace
from pathlib import Path

import yaml

from rayft._version import __version__
from rayft.cache import cache_root
from rayft.config import RayftConfig, dump_config
from rayft.config.model import ModelConfig
from rayft.config.task import TaskConfig
from rayft.custom import load_task, resolve_task_path
from rayft.data.cache_keys import data_cache_dir
from rayft.data.preference import pair_preparation
from rayft.data.prepare import PrepareResult, prepare
from rayft.data.prepared import PreparedData
from rayft.errors import DataError
from rayft.models.architecture import context_tokens, model_config_dict, refuse_fp16, resolve_architecture
from rayft.models.resolve import anchored_name
from rayft.runs import layout
from rayft.runs.location import RunLocation, plan_run_location
from rayft.runs.planner import DataChange, check_resume_data, plan_train_start
from rayft.runs.selection import choose_resume
from rayft.runs.store import RunStore, open_store
from rayft.runtime import ray_is_initialized, ray_runtime
from rayft.training.driver.launcher import resolve_use_gpu, worker_resources
from rayft.training.driver.resources import (
    actor_resources,
    check_actors_fit,
    check_generation_length,
    check_rollout_memory,
    model_shape,
    samples,
)
from rayft.training.loop.plan import Schedule, plan_schedule
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.methods.registry import method_unit
from rayft.training.methods.task.method import write_task_units

log = logging.getLogger("rayft.train")


def run_location(cfg: RayftConfig, mirror_dir: Path | None = None) -> RunLocation:
    """Where the run is written: its directory, or its URI and local mirror (``mirror_dir`` if given)."""
    location = plan_run_location(cfg.storage_path, cfg.name, cache_root())
    return location if mirror_dir is None else location.with_mirror(mirror_dir)


def claim_store(cfg: RayftConfig, store: RunStore, *, resume: bool, retune: bool = False) -> Path:
    """Create (or reopen with ``resume``) the run in ``store`` and save the resolved config in it;
    return the directory training writes into (the run directory, or the local mirror of a remote run).

    Refuses to reuse a run's name without ``--resume``, and to resume with changed settings that
    would make the result a mix of two different runs (:func:`rayft.runs.planner.plan_train_start`).
    A URI is probed (a marker object written and deleted) before anything else. With ``retune``,
    a resume may also change the optimiser settings of :data:`rayft.runs.planner.RETUNABLE_CHANGES`.
    """
    store.probe()
    text = dump_config(cfg)
    plan = plan_train_start(
        store.where, cfg.name, store.state(), store.saved_config(), yaml.safe_load(text), resume=resume, retune=retune
    )
    store.begin(plan, text)
    log.info("run %r: %s at %s", cfg.name, plan.reason, store.where)
    return store.local_dir


def claim_run_dir(cfg: RayftConfig, *, resume: bool, location: RunLocation | None = None, retune: bool = False) -> Path:
    """:func:`claim_store` on the store at ``location`` (default: the config's :func:`run_location`)."""
    return claim_store(cfg, open_store(location or run_location(cfg)), resume=resume, retune=retune)


def prepare_inputs(cfg: RayftConfig, run_dir: Path, *, use_ray: bool) -> PreparedData:
    """The training units: the tokenized data (prepared once, cached), or the example indices of
    a custom task (``task.path``), whose datasets the task builds here and again on every worker."""
    if cfg.task.path is None:
        return prepare_training_data(cfg, run_dir / layout.DATA_DIR, use_ray=use_ray)

    task_cfg = worker_task(cfg)
    assert task_cfg is not None and task_cfg.path is not None
    data = load_task(task_cfg.path, task_cfg.options).build_datasets(cfg.seed)
    log.info("task %s: %d training and %d validation examples", cfg.task.path, len(data.train),
             len(data.validation or ()))  # fmt: skip
    return write_task_units(data_cache_dir(cfg.data), data, key=f"task:{cfg.task.path}")


def prepare_training_data(cfg: RayftConfig, report_dir: Path | None, *, use_ray: bool) -> PreparedData:
    """The tokenized data: SFT examples, or preference pairs (``train.objective`` dpo, orpo, simpo),
    with DPO's reference log-probabilities stored beside them for full fine-tuning."""
    return prepare_for_training(cfg, report_dir, use_ray=use_ray).prepared


def prepare_for_training(
    cfg: RayftConfig, report_dir: Path | None, *, use_ray: bool, ray_address: str | None = None
) -> PrepareResult:
    """:func:`prepare_training_data`, also saying whether the tokenized data came from the cache:
    what ``rayft data prepare`` runs, so that a run of the same config reuses all of it, the
    reference pass of full DPO included. With ``use_ray`` and no Ray yet, Ray is started (or
    ``ray_address`` joined) for the work that needs it."""
    pairs = pair_preparation(cfg.train.preference_objective, cfg.train.preference.max_prompt_length)
    carry = cfg.train.rl.carried_columns if cfg.train.traits.data == "prompts" else ()
    outcome = prepare(cfg.data, cfg.model, cfg.seed, report_dir=report_dir, use_ray=use_ray,
                      ray_address=ray_address, pairs=pairs, carry=carry)  # fmt: skip
    data_pass = method_unit(cfg.train.objective).data_pass(cfg, anchored(cfg.model))
    if data_pass is None:
        return outcome
    with ray_runtime(ray_address) if use_ray else contextlib.nullcontext():
        return replace(outcome, prepared=data_pass(outcome.prepared, use_ray))


def worker_task(cfg: RayftConfig) -> TaskConfig | None:
    """The custom task the workers run, its .py file made absolute (None for a causal LM)."""
    if cfg.task.path is None:
        return None
    return cfg.task.model_copy(update={"path": resolve_task_path(cfg.task.path, Path.cwd())})


def with_worker_task(cfg: RayftConfig) -> RayftConfig:
    """``cfg`` with its custom task's .py file made absolute (unchanged without a task), for
    drivers that do not run in this working directory (the trials of a sweep)."""
    return cfg if cfg.task.path is None else cfg.model_copy(update={"task": worker_task(cfg)})


def build_worker_plan(cfg: RayftConfig, prepared: PreparedData, location: RunLocation) -> WorkerPlan:
    """Decide the step schedule and package everything the workers need (``location``: the
    directory they write, and the URI they upload checkpoints and final/ to when ``storage_path``
    is one)."""
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
    model = anchored(cfg.model)
    return WorkerPlan(
        model=model, lora=cfg.lora, train=cfg.train, logging=cfg.logging, checkpoint=cfg.checkpoint,
        seed=cfg.seed, location=location, resolved_config=dump_config(cfg), schedule=schedule,
        shuffle_window=cfg.data.shuffle_buffer_size, has_validation=has_validation, lineage=lineage,
        task=worker_task(cfg), max_seq_length=cfg.data.max_seq_length,
        packing=cfg.data.packing,
    )  # fmt: skip


def anchored(model: ModelConfig) -> ModelConfig:
    """``model`` with a relative local path anchored here: workers run in another directory."""
    return model.model_copy(update={"name": anchored_name(model.name)})


def check_model_fits_data(cfg: RayftConfig, prepared: PreparedData) -> None:
    """Refuse float16 for the model families that overflow in it, and units prepared for the other
    kind of model (causal sequences for an encoder-decoder, or source/target pairs for a causal LM)."""
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
    if prepared.pairs != cfg.train.preference_objective:
        made = "preference pairs" if prepared.pairs else "SFT examples"
        raise DataError(
            f"data: the prepared dataset {prepared.root} holds {made}, but train.objective={cfg.train.objective!r}; "
            "prepare the data with this config (rayft data prepare with the same train.objective)"
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


def check_resume_data_unchanged(store: RunStore, prepared: PreparedData, policy: DataChange) -> None:
    """Refuse (or, as ``checkpoint.resume_data_change`` says, warn of) a resume whose data prepared to
    another key than the checkpoint it resumes from was trained on."""
    newest = choose_resume(store.checkpoints())
    if newest is None:
        return
    manifest = store.checkpoint_manifest(newest.name)
    recorded = manifest.info.get("data_key") if manifest is not None else None
    warning = check_resume_data(newest.name, recorded if isinstance(recorded, str) else None, prepared.key, policy)
    if warning is not None:
        log.warning("%s", warning)


def check_rollout_length(cfg: RayftConfig) -> None:
    """Before the run is claimed: refuse a GRPO rollout longer than the model's context."""
    if samples(cfg.train) and cfg.task.path is None:
        context = context_tokens(model_config_dict(cfg.model))
        check_generation_length(cfg.train, cfg.data, context, cfg.model.name)


def check_rollout_fits(cfg: RayftConfig) -> None:
    """Once the run's Ray is up (or on this machine, without Ray): refuse generation actors the cluster
    cannot place and a step's rollout that outgrows a node's memory, each with its estimate."""
    if not samples(cfg.train) or cfg.task.path is not None:
        return
    uses_ray = ray_is_initialized()
    nodes = ray_nodes() if uses_ray else [{"CPU": float(os.cpu_count() or 1), "memory": physical_memory()}]
    use_gpu = resolve_use_gpu(cfg.scaling.use_gpu, {k: sum(n.get(k, 0.0) for n in nodes) for k in ("GPU",)})
    rollout = cfg.train.rl.rollout
    if uses_ray and rollout.placement == "actors":
        workers = max(cfg.scaling.num_workers, 1)
        per_worker = worker_resources(cfg.scaling, use_gpu)
        check_actors_fit(per_worker, workers, actor_resources(rollout), rollout.num_actors or workers, nodes)
    if not use_gpu and rollout.num_gpus_per_actor == 0:  # a rollout sampled in host memory
        node_bytes = min(n.get("memory", 0.0) for n in nodes) or physical_memory()
        check_rollout_memory(cfg.train, cfg.data, model_shape(model_config_dict(cfg.model)), node_bytes)


def ray_nodes() -> list[dict[str, float]]:
    """Each alive node's total resources (CPU, GPU, memory in bytes...) of the Ray this process is on."""
    import ray

    return [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]


def physical_memory() -> float:
    """This machine's memory, in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
