"""``rayft tune CONFIG``: a hyper-parameter search over fine-tuning runs on Ray Tune.

Reads top to bottom: check the search before anything starts, start Ray, decide how many trials
fit at once, prepare the data once (trials share it through the cache), run (or continue) the
sweep, and write what each trial became: tune.json, best.yaml, tune.html and a console table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.runtime import check_address, ray_is_initialized, ray_runtime
from rayft.training.driver.startup import with_worker_task
from rayft.tuning import sweep
from rayft.tuning.launch import plan_trials, prepare_once, publish_outputs, run_tuner
from rayft.tuning.results import BEST_YAML, SweepResult, render_table
from rayft.tuning.sweep import SweepPlace
from rayft.tuning.tracker import SweepTracker


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


def finish(cfg: RayftConfig, place: SweepPlace, result: SweepResult, concurrent: int, elapsed_s: float) -> TuneResult:
    """Write tune.json, best.yaml and tune.html; the console table."""
    directory = place.location.local_dir
    publish_outputs(cfg, place, result)
    return TuneResult(
        directory, result, concurrent, render_table(result), elapsed_s, storage_uri=place.location.shown_uri
    )
