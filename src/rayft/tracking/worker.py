"""Rank 0's tracker loggers: each one a :class:`BackgroundSender` fed from the metric stream."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rayft._version import __version__
from rayft.config.train import LoggingConfig
from rayft.tracking import state
from rayft.tracking.mlflow_run import MlflowMetricSink
from rayft.tracking.params import config_params, run_tags
from rayft.tracking.sender import BackgroundSender, MetricSink, SenderReport
from rayft.tracking.wandb_run import WandbMetricSink

log = logging.getLogger("rayft.tracking")


class TrackerLogger:
    """A :class:`~rayft.training.loop.metrics.MetricLogger` that hands records to a sender thread; on
    close, what could not be sent is recorded in ``tracking-unsent.json`` for the driver's report."""

    def __init__(self, sink: MetricSink, run_dir: Path, **sender_options: Any) -> None:
        self._sender = BackgroundSender(sink, **sender_options)
        self._run_dir = run_dir
        self._closed = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Queue the record (never blocks)."""
        self._sender.log(step, metrics)

    def close(self) -> None:
        """Drain the queue (bounded), finish the tracker's run, record what was left unsent."""
        if self._closed:
            return
        self._closed = True
        record_report(self._run_dir, self._sender.close())


def record_report(run_dir: Path, report: SenderReport) -> None:
    """Add a sender's unsent steps to ``tracking-unsent.json`` (kept across restarts)."""
    path = run_dir / state.UNSENT_FILE
    reports: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    entry = reports.setdefault(report.tracker, {"unsent_steps": [], "last_error": None})
    entry["unsent_steps"] = sorted(set(entry["unsent_steps"]) | set(report.unsent_steps))
    entry["last_error"] = report.last_error or entry["last_error"]
    path.write_text(json.dumps(reports, indent=2), encoding="utf-8")


def tracker_loggers(
    logging_cfg: LoggingConfig,
    run_dir: Path,
    resolved_config: str,
    lineage: dict[str, Any],
    ids: dict[str, Any] | None = None,
) -> list[TrackerLogger]:
    """The tracker loggers of rank 0 for the trackers the driver opened: ``ids`` as the driver
    recorded them in ``tracking.json`` (handed over in the worker plan, as rank 0 may run on a node
    that cannot read the driver's files), else read from ``run_dir``."""
    ids = state.read_ids(run_dir) if ids is None else ids
    loggers: list[TrackerLogger] = []
    if logging_cfg.mlflow is not None and "mlflow" in ids:
        sink = MlflowMetricSink(logging_cfg.mlflow.tracking_uri, ids["mlflow"]["run_id"])
        loggers.append(TrackerLogger(sink, run_dir, min_interval_s=logging_cfg.mlflow.send_interval_s))
    if logging_cfg.wandb is not None and "wandb" in ids:
        tags = [f"{k}={v}"[:64] for k, v in run_tags(__version__, lineage).items()]
        wandb_sink = WandbMetricSink(
            logging_cfg.wandb, ids["wandb"]["run_id"], run_dir, name=ids["wandb"].get("name", run_dir.name),
            params=config_params(resolved_config), tags=tags,
        )  # fmt: skip
        loggers.append(TrackerLogger(wandb_sink, run_dir))
    return loggers
