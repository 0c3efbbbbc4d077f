"""``rayft tune CONFIG``: a hyper-parameter search over fine-tuning runs on Ray Tune.

Reads top to bottom: check the search before anything starts, start Ray, decide how many trials
fit at once, prepare the data once (trials share it through the cache), run (or continue) the
sweep, and write what each trial became: tune.json, best.yaml, tune.html and a console table.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.data.prepare import prepare_data
from rayft.errors import ConfigError
from rayft.runtime import check_address, owns_ray, ray_is_initialized, ray_runtime
from rayft.training.driver.startup import make_schedule, prepare_inputs, with_worker_task
from rayft.tuning import sweep
from rayft.tuning.outputs import write_sweep_outputs
from rayft.tuning.plan import plan_concurrency
from rayft.tuning.results import BEST_YAML, SweepResult, render_table
from rayft.tuning.sweep import SweepPlace, evaluations_per_run, trial_driver_resources
from rayft.tuning.tracker import SweepTracker
from rayft.tuning.trial import TrialSetup

log = logging.getLogger("rayft.tune")


@dataclass(frozen=True)
class TuneResult:
    """What a sweep produced.

    ``sweep_dir`` is local (the sweep directory, or its mirror when ``storage_path`` is a URI);
    it holds tune.json, best.yaml (when a trial reported the metric) and tune.html. ``storage_uri``
    is the sweep's durable home when it is a URI (credentials masked).
    """

    sweep_dir: Path
    result: SweepResult
    concurrent: int
    table: str
    elapsed_s: float
    storage_uri: str | None = None

    @property
    def where(self) -> str:
        """Where the sweep lives, as it may be shown: its URI, or its directory."""
        return self.storage_uri or str(self.sweep_dir)

    @property
    def best_config(self) -> Path | None:
        """best.yaml: the best trial's full config, runnable with ``rayft train``."""
        path = self.sweep_dir / BEST_YAML
        return path if path.is_file() else None


def run(cfg: RayftConfig) -> TuneResult:
    """Run the sweep of ``cfg.tune`` over ``cfg``, or continue it: a sweep of the same name started
    with the same config continues where it stopped (finished trials are kept, the others continue
    from their last checkpoint).

    Raises:
        ConfigError: no tune section, a search space path or value that does not fit the config, a
            PBT mutation of a setting that shapes the model, or a sweep of that name with another config.
        ResourceError: not even one trial fits the cluster.
    """

    started = time.monotonic()
    cfg = with_worker_task(cfg)  # trials run in directories of their own: a task's .py file by absolute path
    tune = sweep.check_sweep(cfg)
    place = sweep.sweep_place(cfg, tune)
    text = sweep.sweep_text(cfg)
    sweep.check_saved_sweep(place, text)
    if cfg.scaling.address and not ray_is_initialized():
        check_address(cfg.scaling.address)
    with ray_runtime(cfg.scaling.address, metrics=cfg.logging.prometheus.enabled):
        concurrent = plan_trials(cfg)
        evaluations = prepare_once(cfg)
        sweep.save_sweep_config(place, text)
        tracker = SweepTracker.start(cfg, place.location.local_dir, place.name)
        try:
            result = run_tuner(cfg, place, tracker.parent_run_id, concurrent=concurrent, evaluations=evaluations)
        except BaseException:
            tracker.finish(sweep.empty_result(tune, place), succeeded=False, files=[])
            raise
    outcome = finish(cfg, place, result, concurrent, time.monotonic() - started)
    tracker.finish(result, succeeded=True, files=sweep.output_files(place))
    return outcome


def plan_trials(cfg: RayftConfig) -> int:
    """How many trials run at once (logged with the reason); fails when none fits."""
    import ray

    nodes = [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]
    plan = plan_concurrency(cfg, ray.cluster_resources(), nodes, driver=trial_driver_resources(cfg))
    log.info("tune: %s", plan.reason)
    return plan.concurrent


def prepare_once(cfg: RayftConfig) -> int:
    """Prepare the base config's data (trials whose values leave the data alone reuse it from the
    cache) and return how many reports one training run makes."""
    import tempfile

    assert cfg.tune is not None
    if cfg.task.path is not None:  # a custom task's units are counted here and written by each trial
        with tempfile.TemporaryDirectory(prefix="rayft-task-units-") as scratch:
            prepared = prepare_inputs(cfg, Path(scratch), use_ray=True)
    else:
        prepared = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=True)
    if cfg.tune.metric.startswith("eval/") and prepared.validation is None:
        raise ConfigError(
            f"tune.metric={cfg.tune.metric}: the run has no validation data to evaluate; set "
            "data.validation_fraction (e.g. 0.1) or data.validation_datasets, or tune on train/loss"
        )
    schedule = make_schedule(cfg, prepared, cfg.scaling.num_workers)
    return evaluations_per_run(cfg, schedule.total_steps)


def run_tuner(
    cfg: RayftConfig, place: SweepPlace, parent_run_id: str | None, *, concurrent: int, evaluations: int
) -> SweepResult:
    """Fit the new or restored ``Tuner`` of the sweep (trials' tracker runs nested under
    ``parent_run_id``); what each trial became."""
    assert cfg.tune is not None
    setup = TrialSetup(cfg, place.trials_root, owns_ray(), parent_run_id)
    tuner = sweep.build_tuner(cfg.tune, place, setup, concurrent=concurrent, evaluations=evaluations)
    with warnings.catch_warnings():
        # Tune's advice for PBT to reuse trial processes: a trial's process only builds and waits
        # for its trainer, whose workers start afresh either way.
        warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
        grid = tuner.fit()
    return sweep.sweep_result(cfg.tune, place, grid, evaluations)


def finish(cfg: RayftConfig, place: SweepPlace, result: SweepResult, concurrent: int, elapsed_s: float) -> TuneResult:
    """Write tune.json, best.yaml and tune.html; the console table."""
    directory = place.location.local_dir
    for orphan in sweep.orphan_runs(place, result):
        log.warning(
            "tune: %s belongs to no trial of the sweep (a trial started after Tune last saved the sweep's state "
            "before its driver stopped; its place in the search ran again as a new trial); remove it when unneeded",
            orphan,
        )
    write_sweep_outputs(directory, result, cfg)
    sweep.upload_outputs(place)
    best = result.best
    if best is not None and best.metric is not None and not math.isnan(best.metric):
        log.info("tune: best trial %s with %s=%.4f %s", best.trial_id, result.metric, best.metric, best.params)
    return TuneResult(
        directory, result, concurrent, render_table(result), elapsed_s, storage_uri=place.location.shown_uri
    )
