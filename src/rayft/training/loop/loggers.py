"""The metric sinks of a worker's run: metrics.jsonl, TensorBoard, the console and the trackers on rank 0,
live Prometheus gauges on every rank that asks for them."""

from __future__ import annotations

from rayft.runs import layout
from rayft.tracking.live import count_start, open_live_metrics
from rayft.tracking.worker import tracker_loggers
from rayft.training.loop.metrics import (
    ConsoleLogger,
    JsonlLogger,
    MetricLogger,
    MultiLogger,
    NullLogger,
    TensorBoardLogger,
)
from rayft.training.loop.session import RaySession, TrainSession
from rayft.training.loop.worker_plan import WorkerPlan


def open_loggers(plan: WorkerPlan, session: TrainSession, start_step: int) -> MetricLogger:
    """Metric sinks on rank 0; the other workers log only live metrics (``logging.prometheus``)."""
    run_dir = plan.run_dir
    live = open_live(plan, session) if plan.logging.prometheus.enabled else None
    if session.rank != 0:
        return live or NullLogger()
    loggers: list[MetricLogger] = [JsonlLogger(run_dir / layout.METRICS_FILE, start_step)]
    if live is not None:
        loggers.append(live)
    if plan.logging.tensorboard:
        loggers.append(TensorBoardLogger(run_dir / layout.TENSORBOARD_DIR))
    if plan.logging.console:
        loggers.append(ConsoleLogger(plan.schedule.total_steps, start_step))
    if plan.logging.mlflow is not None or plan.logging.wandb is not None:
        ids = plan.tracker_ids or None
        loggers.extend(tracker_loggers(plan.logging, run_dir, plan.resolved_config, plan.lineage, ids))
    return MultiLogger(loggers)


def open_live(plan: WorkerPlan, session: TrainSession) -> MetricLogger:
    """This rank's live Prometheus gauges, with the run's restarts and rejected rows set."""
    cfg = plan.logging.prometheus
    live = open_live_metrics(
        host=cfg.host, port=cfg.port, on_ray=isinstance(session, RaySession), run=str(plan.lineage.get("run", "")),
        rank=session.rank, device=session.device,
    )  # fmt: skip
    if session.rank == 0:
        live.set("rayft_worker_restarts", count_start(plan.run_dir))
        live.set("rayft_data_rejected_rows", float(plan.lineage.get("rejected_rows", 0)))
    return live
