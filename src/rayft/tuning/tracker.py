"""The tracker run of a sweep: an MLflow parent run with every trial's training run nested under it.

The sweep's driver opens (or, on a resumed sweep, reopens) the parent run and records its id in
``<sweep dir>/tracking.json``; each trial trains inside :func:`rayft.tracking.driver.nested_under`
with that id, so its run is created as a child. At the end the parent gets the best trial's values
and metric, a count of trials per status, and the sweep's files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig
from rayft.tracking import state
from rayft.tracking.driver import open_mlflow
from rayft.tuning.results import SweepResult

log = logging.getLogger("rayft.tracking")


@dataclass
class SweepTracker:
    """The sweep's parent run (``run`` is None without ``logging.mlflow`` or when the server is
    unreachable and not required); every method is then a no-op."""

    sweep_dir: Path
    run: Any = None

    @classmethod
    def start(cls, cfg: RayftConfig, sweep_dir: Path, sweep_name: str) -> SweepTracker:
        """Open (or reopen) the parent run named after the sweep, with the tune section as params."""
        mlflow_cfg = cfg.logging.mlflow
        if mlflow_cfg is None or cfg.tune is None:
            return cls(sweep_dir)
        run_id = state.read_ids(sweep_dir).get("mlflow", {}).get("run_id")
        run = open_mlflow(mlflow_cfg, sweep_name, run_id=run_id)
        if run is None:
            return cls(sweep_dir)
        tune = cfg.tune.model_dump(mode="json")
        run.log_params({f"tune.{k}": str(v) for k, v in tune.items() if k not in ("search_space", "pbt")})
        run.log_params({f"search_space.{path}": str(d) for path, d in tune["search_space"].items()})
        run.set_tags({"rayft.version": __version__, "rayft.sweep": "true"})
        state.write_ids(sweep_dir, "mlflow", {"run_id": run.run_id})
        return cls(sweep_dir, run)

    @property
    def parent_run_id(self) -> str | None:
        """The id trials nest their runs under (None: trials log top-level runs, or none)."""
        return None if self.run is None else str(self.run.run_id)

    def finish(self, result: SweepResult, *, succeeded: bool, files: list[Path]) -> None:
        """Log the best trial and the trial counts, upload the sweep's files, end the run. Never raises:
        the sweep's results are already on disk."""
        if self.run is None:
            return
        try:
            self.run.log_metrics(sweep_metrics(result))
            best = result.best
            if best is not None:
                self.run.set_tags({"rayft.best_trial": best.trial_id, "rayft.best_run_dir": best.run_dir})
                self.run.log_params({f"best.{k}": str(v) for k, v in best.params.items()})
            for path in files:
                if path.is_file():
                    self.run.log_artifact(path)
            self.run.end("FINISHED" if succeeded else "FAILED")
        except Exception as exc:  # an outage at the end costs the summary, not the sweep
            log.warning("MLflow: could not finish sweep run %s (%s: %s); %s holds everything", self.run.run_id,
                        type(exc).__name__, str(exc).splitlines()[0][:200], self.sweep_dir)  # fmt: skip


def sweep_metrics(result: SweepResult) -> dict[str, float]:
    """The parent run's metrics: the best value of the sweep's metric and a count of trials per status."""
    metrics: dict[str, float] = {"trials": float(len(result.trials))}
    for trial in result.trials:
        key = f"trials.{trial.status.lower()}"
        metrics[key] = metrics.get(key, 0.0) + 1.0
    best = result.best
    if best is not None and best.metric is not None:
        metrics[f"best.{result.metric.replace('/', '_')}"] = best.metric
    return metrics
