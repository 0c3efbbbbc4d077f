"""The work of a sweep, for the ``rayft tune`` recipe to sequence: how many trials fit at once, the
data prepared once for every trial, the Ray Tune run itself (new or restored), and the sweep's
outputs (tune.json, best.yaml, tune.html)."""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
from pathlib import Path

from rayft._ray_private import actor_made_groups
from rayft.config import RayftConfig
from rayft.errors import ConfigError
from rayft.runtime import owns_ray
from rayft.training.driver.startup import make_schedule, prepare_inputs, prepare_training_data
from rayft.tuning import sweep
from rayft.tuning.outputs import write_sweep_outputs
from rayft.tuning.plan import plan_concurrency
from rayft.tuning.reaper import settle_groups
from rayft.tuning.results import SweepResult
from rayft.tuning.sweep import SweepPlace, evaluations_per_run, trial_driver_resources
from rayft.tuning.trial import TrialSetup

log = logging.getLogger("rayft.tune")


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
    assert cfg.tune is not None
    if cfg.task.path is not None:  # a custom task's units: written to the data cache here, reused by each trial
        with tempfile.TemporaryDirectory(prefix="rayft-task-") as scratch:  # the run directory it does not use
            prepared = prepare_inputs(cfg, Path(scratch), use_ray=True)
    else:
        prepared = prepare_training_data(cfg, None, use_ray=True)
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
    groups_before = set(actor_made_groups())
    with warnings.catch_warnings():
        # Tune's advice for PBT to reuse trial processes: a trial's process only builds and waits
        # for its trainer, whose workers start afresh either way.
        warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
        grid = tuner.fit()
    settle_groups(groups_before)
    return sweep.sweep_result(cfg.tune, place, grid, evaluations)


def publish_outputs(cfg: RayftConfig, place: SweepPlace, result: SweepResult) -> None:
    """Write tune.json, best.yaml and tune.html into the sweep directory (uploaded when the sweep
    lives at a URI); warn of run directories that belong to no trial; log the best trial."""
    for orphan in sweep.orphan_runs(place, result):
        log.warning(
            "tune: %s belongs to no trial of the sweep (a trial started after Tune last saved the sweep's state "
            "before its driver stopped; its place in the search ran again as a new trial); remove it when unneeded",
            orphan,
        )
    write_sweep_outputs(place.location.local_dir, result, cfg)
    sweep.upload_outputs(place)
    best = result.best
    if best is not None and best.metric is not None and not math.isnan(best.metric):
        log.info("tune: best trial %s with %s=%.4f %s", best.trial_id, result.metric, best.metric, best.params)
