"""MLflow: the driver opens (or reopens) the run, logs params, tags and artifacts and ends it; rank 0's
sender thread logs the metric stream into it (:class:`MlflowMetricSink`).

Every call goes through ``MlflowClient`` with an explicit tracking URI: nothing touches MLflow's
global active run, so nested pipeline runs and a training run in the same process do not mix.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.config.tracking import MlflowConfig
from rayft.security import mask_uri
from rayft.tracking.errors import TrackerUnavailableError, probe_http, require_extra
from rayft.tracking.sender import Record

log = logging.getLogger("rayft.tracking")

PARENT_TAG = "mlflow.parentRunId"
# MLflow's HTTP client retries 7 times with doubling waits by default (minutes against a dead server);
# rayft retries in its own sender thread, so each request fails fast. An exported value wins.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
_BATCH_LIMIT = 1000  # metrics per log_batch request (MLflow's limit)


def client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` for ``tracking_uri`` with rayft's fail-fast HTTP defaults."""
    require_extra("mlflow", "mlflow")
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def reachable(cfg: MlflowConfig) -> bool:
    """Whether the server answers; an unreachable one raises when ``cfg.required`` (naming the URI),
    and is a warning otherwise."""
    require_extra("mlflow", "mlflow")
    try:
        probe_http(cfg.tracking_uri)
    except TrackerUnavailableError as exc:
        if cfg.required:
            raise
        log.warning("%s; logging.mlflow.required is false: the run goes on without MLflow", exc)
        return False
    return True


class MlflowRun:
    """One MLflow run seen from the driver."""

    def __init__(self, cfg: MlflowConfig, run_id: str) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.client = client(cfg.tracking_uri)

    @classmethod
    def open(
        cls, cfg: MlflowConfig, *, name: str, run_id: str | None = None, parent_id: str | None = None
    ) -> MlflowRun:
        """Reopen ``run_id`` (marked running again), or create a run named ``name`` in the
        experiment (nested under ``parent_id`` when given)."""
        mlflow_client = client(cfg.tracking_uri)
        if run_id is not None:
            mlflow_client.update_run(run_id, status="RUNNING")
            log.info("MLflow: continuing run %s at %s", run_id, mask_uri(cfg.tracking_uri))
            return cls(cfg, run_id)
        experiment = mlflow_client.get_experiment_by_name(cfg.experiment)
        experiment_id = experiment.experiment_id if experiment else mlflow_client.create_experiment(cfg.experiment)
        tags = {PARENT_TAG: parent_id} if parent_id else {}
        run = mlflow_client.create_run(experiment_id, run_name=name, tags=tags)
        log.info("MLflow: run %s (%s) in experiment %r at %s", run.info.run_id, name, cfg.experiment,
                 mask_uri(cfg.tracking_uri))  # fmt: skip
        return cls(cfg, run.info.run_id)

    def log_params(self, params: dict[str, str]) -> None:
        """Log the params the run does not hold yet (a resumed run keeps its first values)."""
        from mlflow.entities import Param

        held = self.client.get_run(self.run_id).data.params
        new = [Param(k, v) for k, v in params.items() if k not in held]
        for start in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[start : start + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set (or update) tags."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Log a few metrics at ``step`` (stage summaries)."""
        MlflowMetricSink(self.cfg.tracking_uri, self.run_id, client_=self.client).send([(step, _now(), metrics)])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file or a directory (skipped with a note when it does not exist)."""
        if not path.exists():
            log.info("MLflow: no %s to upload", path)
            return
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path or path.name)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def end(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self.run_id, status=status)


class MlflowMetricSink:
    """The metric stream of rank 0 into an existing run (used by the sender thread)."""

    name = "MLflow"

    def __init__(self, tracking_uri: str, run_id: str, *, client_: Any = None) -> None:
        self._uri = tracking_uri
        self._run_id = run_id
        self._client = client_

    def connect(self) -> dict[str, int]:
        """The highest step of each metric the run already holds: a restarted worker logs only the
        steps beyond it, so no step appears twice in a history."""
        if self._client is None:
            self._client = client(self._uri)
        keys = self._client.get_run(self._run_id).data.metrics.keys()
        return {key: max(m.step for m in self._client.get_metric_history(self._run_id, key)) for key in keys}

    def send(self, records: Sequence[Record]) -> None:
        """One ``log_batch`` per 1000 values."""
        from mlflow.entities import Metric

        metrics = [
            Metric(key, float(value), int(at * 1000), step)
            for step, at, values in records
            for key, value in values.items()
            if value is not None and math.isfinite(value)  # a NaN loss (null in metrics.jsonl) is not a point
        ]
        for start in range(0, len(metrics), _BATCH_LIMIT):
            self._client.log_batch(self._run_id, metrics=metrics[start : start + _BATCH_LIMIT])

    def close(self) -> None:
        """The driver ends the run."""


def _now() -> float:
    import time

    return time.time()
