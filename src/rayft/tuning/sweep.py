"""Running a sweep on Ray Tune: the checks before anything starts, the scheduler and search
algorithm of ``tune``, a fresh or restored ``Tuner``, and what each trial became.

The sweep lives under ``<storage_path>/<sweep name>/``: Tune's experiment state, ``sweep.yaml`` (the
config it runs), ``trials/<trial id>/`` (each trial's rayft run directory) and the results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft._ray_private import trial_result_loggers
from rayft.cache import cache_root
from rayft.config import RayftConfig, dump_config
from rayft.config.tune import TuneConfig
from rayft.errors import ConfigError
from rayft.runs import layout
from rayft.runs.checkpoints import scan_checkpoints
from rayft.runs.location import RunLocation, plan_run_location, storage_root
from rayft.runs.planner import check_retunable, flatten
from rayft.runs.store import open_store
from rayft.tuning.plan import TRIAL_DRIVER_RESOURCES
from rayft.tuning.reaper import reaper_callback
from rayft.tuning.results import BEST_YAML, TUNE_HTML, TUNE_JSON, SweepResult, TrialRecord, TrialStatus, pick_best
from rayft.tuning.space import check_search_space, to_ray_mutations, to_ray_space
from rayft.tuning.task_eval import check_metric, eval_task_metric
from rayft.tuning.trial import run_trial

log = logging.getLogger("rayft.tune")

SWEEP_CONFIG_FILE = "sweep.yaml"
TRIALS_DIR = "trials"
TUNE_CHECKPOINTS_TO_KEEP = 4  # pointers of a few bytes; PBT copies a trial's latest
SWEEP_RESUMABLE_CHANGES = ("scaling.", "failure.", "logging.", "k8s.")
"""Settings a sweep may continue under when they changed: where and how its trials run, not what they train."""
OPTUNA_MISSING = (
    "tune.search_algorithm=optuna needs Optuna, which is not installed: pip install 'rayft[tune]' "
    "(or set tune.search_algorithm to random or grid)"
)


def trial_driver_resources(cfg: RayftConfig) -> dict[str, float]:
    """What a trial's own process reserves: :data:`TRIAL_DRIVER_RESOURCES`, and, when it scores its
    checkpoints with the evaluation task (an ``eval_task/`` metric), ``eval.num_gpus_per_worker``
    GPUs to generate on (none: it generates on its CPU)."""
    scoring = cfg.tune is not None and eval_task_metric(cfg.tune.metric) is not None
    gpus = cfg.eval.num_gpus_per_worker if scoring else 0.0
    return {**TRIAL_DRIVER_RESOURCES, **({"GPU": gpus} if gpus > 0 else {})}


@dataclass(frozen=True)
class SweepPlace:
    """Where a sweep lives: Tune's ``storage_path`` and ``name``, and the local directory of its
    state (itself, or a mirror of a URI)."""

    storage: str
    name: str
    location: RunLocation

    @property
    def uri(self) -> str:
        """The sweep directory as Tune addresses it."""
        return self.location.storage_under()

    @property
    def trials_root(self) -> str:
        """Where the trials' rayft run directories go."""
        return self.location.storage_under(TRIALS_DIR)


def sweep_place(cfg: RayftConfig, tune: TuneConfig) -> SweepPlace:
    """The sweep's place under ``cfg.storage_path``."""
    name = tune.sweep_name(cfg.name)
    return SweepPlace(storage_root(cfg.storage_path), name, plan_run_location(cfg.storage_path, name, cache_root()))


def check_sweep(cfg: RayftConfig) -> TuneConfig:
    """Everything about the sweep that can be refused before Ray starts; returns ``cfg.tune``."""
    tune = cfg.tune
    if tune is None:
        raise ConfigError(
            "rayft tune: the config has no tune section; add one, e.g. tune: {search_space: "
            "{train.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}}}"
        )
    if cfg.scaling.num_workers < 1:
        raise ConfigError(
            f"scaling.num_workers={cfg.scaling.num_workers}: each trial trains on Ray Train workers; "
            "set scaling.num_workers=1 or more"
        )
    check_search_space(cfg)
    check_metric(cfg)
    check_search_algorithm(tune)
    if tune.scheduler == "pbt":
        check_retunable(tuple(tune.mutations))
        sweep_place(cfg, tune).location.refuse_remote(
            "scheduler pbt copies checkpoints between trials on a shared filesystem; give a directory (a shared "
            "mount on a cluster), or use scheduler asha"
        )
    return tune


def check_search_algorithm(tune: TuneConfig) -> None:
    """Refuse ``search_algorithm: optuna`` without Optuna installed, before Ray starts."""
    import importlib.util

    if tune.search_algorithm == "optuna" and importlib.util.find_spec("optuna") is None:
        raise ConfigError(OPTUNA_MISSING)


def check_saved_sweep(place: SweepPlace, text: str) -> None:
    """Refuse to continue a sweep of the same name that was started with another config (where and
    how its workers run, :data:`SWEEP_RESUMABLE_CHANGES`, may differ)."""
    import yaml

    saved_file = place.location.local_dir / SWEEP_CONFIG_FILE
    if not saved_file.is_file():
        return
    before, after = flatten(yaml.safe_load(saved_file.read_text(encoding="utf-8"))), flatten(yaml.safe_load(text))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    blocking = [k for k in changed if not k.startswith(SWEEP_RESUMABLE_CHANGES)]
    if blocking:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in blocking[:5])
        raise ConfigError(
            f"tune: the sweep {place.name!r} at {place.uri} was started with another config ({details}); rerun it "
            f"with its own config ({saved_file}) to continue it, or set tune.name to start another sweep"
        )


def make_scheduler(tune: TuneConfig, evaluations: int) -> Any:
    """Tune's trial scheduler for ``tune.scheduler``; ``evaluations``: the reports one training run
    makes (the default ``max_t``)."""
    from ray.tune.schedulers import (
        AsyncHyperBandScheduler,
        FIFOScheduler,
        HyperBandScheduler,
        PopulationBasedTraining,
    )

    max_t = tune.max_t or max(evaluations, 1)
    if tune.scheduler == "asha":
        return AsyncHyperBandScheduler(
            time_attr="training_iteration", max_t=max_t, grace_period=min(tune.grace_period, max_t),
            reduction_factor=tune.reduction_factor,
        )  # fmt: skip
    if tune.scheduler == "hyperband":
        return HyperBandScheduler(time_attr="training_iteration", max_t=max_t, reduction_factor=tune.reduction_factor)
    if tune.scheduler == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=tune.pbt.perturbation_interval,
            hyperparam_mutations=to_ray_mutations(tune), quantile_fraction=tune.pbt.quantile_fraction,
            resample_probability=tune.pbt.resample_probability, synch=tune.pbt.synch,
        )  # fmt: skip
    return FIFOScheduler()


def make_search(tune: TuneConfig, concurrent: int) -> Any:
    """Tune's search algorithm for ``tune.search_algorithm``, running at most ``concurrent`` trials
    at once (Tune limits a searcher such as Optuna's itself, through ``max_concurrent_trials``)."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if tune.search_algorithm != "optuna":
        return BasicVariantGenerator(random_state=tune.seed, max_concurrent=concurrent)
    try:
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(seed=tune.seed)
    except (ImportError, AssertionError):  # Ray asserts that optuna is importable
        raise ConfigError(OPTUNA_MISSING) from None


def trial_dirname(trial: Any) -> str:
    """Tune's directory of a trial: its id (its rayft run is trials/<id>/)."""
    return str(trial.trial_id)


def make_trainable(setup: Any) -> Any:
    """The trial function with the sweep's setup bound, and the resources of the trial's driver.

    The driver only builds and waits for a ``TorchTrainer`` whose workers reserve their own
    resources (``scaling``); it takes a token share of the node's memory so that Tune can place
    it without holding a CPU that training needs (and the GPUs it scores checkpoints on,
    :func:`trial_driver_resources`). How many trials run at once is bounded by
    ``max_concurrent_trials`` (:func:`rayft.tuning.plan.plan_concurrency`).
    """
    from functools import partial

    from ray import tune

    function: Callable[[dict[str, Any]], None] = partial(run_trial, setup=setup)
    return tune.with_resources(function, trial_driver_resources(setup.base))


def build_tuner(tune_cfg: TuneConfig, place: SweepPlace, setup: Any, *, concurrent: int, evaluations: int) -> Any:
    """A new ``Tuner`` of the sweep, or the one restored from its state (finished trials are kept,
    unfinished and errored ones continue from their last checkpoint)."""
    import ray.tune
    from ray import tune

    trainable = make_trainable(setup)
    if tune.Tuner.can_restore(place.uri):
        log.info("tune: continuing the sweep at %s", place.uri)
        return tune.Tuner.restore(place.uri, trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space=to_ray_space(tune_cfg),
        tune_config=tune.TuneConfig(
            metric=tune_cfg.metric, mode=tune_cfg.mode, num_samples=tune_cfg.num_samples,
            scheduler=make_scheduler(tune_cfg, evaluations), search_alg=make_search(tune_cfg, concurrent),
            max_concurrent_trials=concurrent, trial_dirname_creator=trial_dirname,
        ),
        run_config=ray.tune.RunConfig(
            name=place.name, storage_path=place.storage, verbose=1,
            checkpoint_config=ray.tune.CheckpointConfig(num_to_keep=TUNE_CHECKPOINTS_TO_KEEP),
            failure_config=ray.tune.FailureConfig(max_failures=0),
            callbacks=[reaper_callback(lambda trial_id: trial_run_dir(place, trial_id)), *trial_result_loggers()],
        ),
    )  # fmt: skip


def evaluations_per_run(cfg: RayftConfig, total_steps: int) -> int:
    """The reports one training run makes: one per checkpoint, the last step's included (a trial
    saves at every evaluation, :func:`rayft.tuning.trial.trial_config`)."""
    every = cfg.train.save_steps
    if cfg.train.eval_steps is not None:
        every = min(every, cfg.train.eval_steps)
    return -(-total_steps // every)


def save_sweep_config(place: SweepPlace, text: str) -> None:
    """Write ``sweep.yaml`` into the sweep directory."""
    directory = place.location.local_dir
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SWEEP_CONFIG_FILE).write_text(text, encoding="utf-8")


def sweep_text(cfg: RayftConfig) -> str:
    """The sweep's config as it is saved (the run config with its tune section)."""
    return dump_config(cfg)


def trial_location(place: SweepPlace, trial_id: str) -> RunLocation:
    """Where a trial's rayft run lives: its directory, or its URI and local mirror."""
    return plan_run_location(place.trials_root, trial_id, cache_root())


def trial_run_dir(place: SweepPlace, trial_id: str) -> Path:
    """The local run directory of a trial (its mirror when the sweep is on a URI)."""
    return trial_location(place, trial_id).local_dir


def empty_result(tune: TuneConfig, place: SweepPlace) -> SweepResult:
    """The result of a sweep that ended before any trial did."""
    return SweepResult(place.name, tune.metric, tune.mode, [], None)


def sweep_result(tune: TuneConfig, place: SweepPlace, grid: Any, evaluations: int | None = None) -> SweepResult:
    """What each trial of Tune's ``ResultGrid`` became, from its reports and its rayft run
    (``evaluations``: the reports one whole training run makes)."""
    trials = [trial_record(tune, place, result, evaluations) for result in grid]
    trials.sort(key=lambda t: t.trial_id)
    return SweepResult(place.name, tune.metric, tune.mode, trials, pick_best(trials, tune.mode))


def trial_record(tune: TuneConfig, place: SweepPlace, result: Any, evaluations: int | None = None) -> TrialRecord:
    """One trial: its values, metric history (Tune's reports), steps and why it stopped, asking the
    trial's store (its directory, or its URI) whether it finished."""
    trial_id = Path(str(result.path)).name
    store = open_store(trial_location(place, trial_id))
    history = report_history(result.metrics_dataframe, tune.metric)
    metrics = result.metrics or {}
    metric = metrics.get(tune.metric)
    values = [value for _, value in history]
    best = (min(values) if tune.mode == "min" else max(values)) if values else None
    final = store.final_manifest()
    steps = final.step if final is not None else trained_steps(store.local_dir, metrics)
    full = rung_reports(tune, evaluations)
    status, reason = trial_outcome(tune, final is not None, result.error, len(history), steps, full_reports=full)
    return TrialRecord(
        trial_id=trial_id, params=dict(result.config or {}), metric=float(metric) if metric is not None else None,
        best_metric=best, steps=steps, status=status, stop_reason=reason, run_dir=str(store.local_dir),
        history=history,
    )  # fmt: skip


def report_history(frame: Any, metric: str) -> list[tuple[int, float]]:
    """(step, metric) of every report Tune recorded."""
    if frame is None or metric not in getattr(frame, "columns", ()) or "step" not in frame.columns:
        return []
    rows = frame[["step", metric]].dropna()
    return [(int(step), float(value)) for step, value in zip(rows["step"], rows[metric], strict=True)]


def trained_steps(run_dir: Path, metrics: dict[str, Any]) -> int:
    """Steps an unfinished trial's run trained: its newest checkpoint's, else its last report's."""
    steps = [c.step for c in scan_checkpoints(run_dir / layout.CHECKPOINTS_DIR) if c.complete]
    return max([int(metrics.get("step", 0) or 0), *steps])


def rung_reports(tune: TuneConfig, evaluations: int | None) -> int | None:
    """The reports an asha or hyperband trial makes unless the scheduler stops it (None for the
    other schedulers, or when the run's evaluations are not known)."""
    if tune.scheduler not in ("asha", "hyperband") or evaluations is None:
        return None
    return min(tune.max_t or evaluations, evaluations)


def trial_outcome(
    tune: TuneConfig,
    finished: bool,
    error: BaseException | None,
    reports: int,
    steps: int,
    *,
    full_reports: int | None = None,
) -> tuple[TrialStatus, str]:
    """Finished (``finished``: its store holds final/), stopped by the scheduler (ended without
    final/, or after fewer than ``full_reports`` reports: training goes on while Tune decides, and
    may have reached its end before the stop took effect) or failed."""
    if error is not None:
        return "ERROR", f"error: {error_line(error)}"
    if finished and (full_reports is None or reports >= full_reports):
        return "TERMINATED", f"finished: trained all {steps} steps"
    reason = f"stopped early by {tune.scheduler} after {reports} report(s)"
    if finished:
        return "STOPPED_EARLY", f"{reason} (training reached its end, step {steps}, before the stop took effect)"
    return "STOPPED_EARLY", f"{reason}, at step {steps}"


def error_line(error: BaseException) -> str:
    """The line of a trial's error that names it (Ray wraps it in its own traceback)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line and not line.startswith("Traceback")]
    return (named[-1] if named else lines[-1] if lines else type(error).__name__)[:300]


def orphan_runs(place: SweepPlace, result: SweepResult) -> list[Path]:
    """Run directories under trials/ that belong to no trial of the sweep: trials Tune started after
    it last saved its state (at the start, then every 10 s or more) before the driver stopped; the
    restored sweep does not know them and ran their place in the search as new trials."""
    root = place.location.local_dir / TRIALS_DIR
    known = {t.trial_id for t in result.trials}
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name not in known) if root.is_dir() else []


def output_files(place: SweepPlace) -> list[Path]:
    """The sweep's result files."""
    directory = place.location.local_dir
    return [directory / name for name in (TUNE_JSON, BEST_YAML, TUNE_HTML, SWEEP_CONFIG_FILE)]


def upload_outputs(place: SweepPlace) -> None:
    """Make the result files durable: with a URI ``storage_path``, copy them from the local mirror
    to the sweep's URI."""
    store = open_store(place.location)
    for path in output_files(place):
        store.persist(path.name)
