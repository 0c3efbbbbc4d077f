"""The driver's side of the trackers: open (or reopen) the runs before training, log params and
tags, and at the end upload artifacts, report what the workers could not send, and end the runs.

``rayft train`` logs one MLflow run; ``rayft run`` logs a parent run with a nested run per stage
(:class:`PipelineTracker`), and the train stage's nested run is the one its training logs into.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig, dump_config
from rayft.config.tracking import MlflowArtifact, MlflowConfig
from rayft.runs import layout
from rayft.tracking import state
from rayft.tracking.errors import TrackerUnavailableError, check_wandb_key, require_extra
from rayft.tracking.mlflow_run import MlflowRun, reachable
from rayft.tracking.params import config_params, run_tags, summary_metrics
from rayft.tracking.wandb_run import new_run_id

log = logging.getLogger("rayft.tracking")

# The MLflow run of the pipeline stage being run, for the training run it starts to log into.
_STAGE_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("rayft_stage_run", default=None)

PARENT_RUN_ENV = "RAYFT_MLFLOW_PARENT_RUN_ID"
"""A training run started while this is set opens its MLflow run nested under that run (a sweep's
trials under the sweep). An environment variable, not a context variable: a trial trains on other
threads of its process."""


@dataclass
class TrainingTrackers:
    """The trackers of one training run, as opened by :func:`start_training`."""

    run_dir: Path
    mlflow: Any = None  # MlflowRun
    owns_mlflow: bool = True  # a pipeline stage's run is ended by the pipeline

    def finish(self, *, succeeded: bool, artifacts: dict[MlflowArtifact, Path] | None = None) -> None:
        """Report unsent metrics, upload the artifacts the config asks for, end the run. Never raises:
        the training result is already on disk."""
        report_unsent(self.run_dir)
        if self.mlflow is None:
            return
        try:
            upload(self.mlflow, artifacts or {})
            if self.owns_mlflow:
                self.mlflow.end("FINISHED" if succeeded else "FAILED")
        except Exception as exc:  # an outage at the end costs the artifacts, not the run
            log.warning("MLflow: could not finish run %s (%s: %s); the run directory holds everything",
                        self.mlflow.run_id, type(exc).__name__, str(exc).splitlines()[0][:200])  # fmt: skip


def start_training(cfg: RayftConfig, run_dir: Path, lineage: dict[str, Any]) -> TrainingTrackers:
    """Open the training run's trackers; their ids go to ``tracking.json`` for the workers (and for a
    restart or ``--resume``, which continue the same runs)."""
    trackers = TrainingTrackers(run_dir)
    ids = state.read_ids(run_dir)
    mlflow_cfg = cfg.logging.mlflow
    if mlflow_cfg is not None:
        stage_run = _STAGE_RUN.get()
        run_id = ids.get("mlflow", {}).get("run_id") or stage_run
        parent_id = os.environ.get(PARENT_RUN_ENV) or None
        trackers.mlflow = open_mlflow(mlflow_cfg, mlflow_cfg.run_name or cfg.name, run_id=run_id, parent_id=parent_id)
        trackers.owns_mlflow = stage_run is None
        if trackers.mlflow is not None:
            trackers.mlflow.log_params(config_params(dump_config(cfg)))
            trackers.mlflow.set_tags(run_tags(__version__, lineage))
            state.write_ids(run_dir, "mlflow", {"run_id": trackers.mlflow.run_id})
    if cfg.logging.wandb is not None and wandb_usable(cfg):
        run_id = ids.get("wandb", {}).get("run_id")
        if run_id is None:
            run_id = new_run_id()
        state.write_ids(run_dir, "wandb", {"run_id": run_id, "name": cfg.name})
    return trackers


@contextlib.contextmanager
def nested_under(parent_run_id: str | None) -> Iterator[None]:
    """Training runs started inside open their MLflow run nested under ``parent_run_id`` (None: no
    change). The previous value is restored on the way out."""
    if parent_run_id is None:
        yield
        return
    before = os.environ.get(PARENT_RUN_ENV)
    os.environ[PARENT_RUN_ENV] = parent_run_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = before


def open_mlflow(cfg: MlflowConfig, name: str, *, run_id: str | None = None, parent_id: str | None = None) -> Any:
    """An :class:`MlflowRun`, or None when the server is unreachable and not ``required``."""
    if not reachable(cfg):
        return None
    try:
        return MlflowRun.open(cfg, name=name, run_id=run_id, parent_id=parent_id)
    except Exception as exc:
        if cfg.required:
            raise
        log.warning("MLflow: cannot open a run (%s); logging.mlflow.required is false: going on without it", exc)
        return None


def wandb_usable(cfg: RayftConfig) -> bool:
    """Whether W&B can log (installed; a key in online mode); raises when it cannot and is required."""
    wandb_cfg = cfg.logging.wandb
    assert wandb_cfg is not None
    try:
        require_extra("wandb", "wandb")
        check_wandb_key(wandb_cfg.mode)
    except TrackerUnavailableError as exc:
        if wandb_cfg.required:
            raise
        log.warning("%s; logging.wandb.required is false: the run goes on without W&B", exc)
        return False
    return True


def upload(run: Any, artifacts: dict[MlflowArtifact, Path]) -> None:
    """Upload the artifacts of ``artifacts`` that the run's config names."""
    for kind in run.cfg.artifacts:
        path = artifacts.get(kind)
        if path is not None:
            run.log_artifact(path)


def report_unsent(run_dir: Path) -> None:
    """Log what the workers' sender threads could not deliver (it stays in metrics.jsonl)."""
    path = run_dir / state.UNSENT_FILE
    if not path.is_file():
        return
    for tracker, entry in json.loads(path.read_text(encoding="utf-8")).items():
        steps = entry.get("unsent_steps") or []
        if steps:
            log.warning(
                "%s: %d metric records (steps %d-%d) were not sent (%s); they are in %s", tracker, len(steps),
                min(steps), max(steps), entry.get("last_error"), run_dir / layout.METRICS_FILE,
            )  # fmt: skip


class PipelineTracker:
    """The MLflow parent run of ``rayft run`` and a nested run per stage it runs."""

    def __init__(self, cfg: RayftConfig, run_dir: Path, parent: Any) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.parent = parent
        self._current: Any = None  # the nested run of the stage that just ran

    @classmethod
    def start(cls, cfg: RayftConfig, run_dir: Path) -> PipelineTracker:
        """Open (or reopen) the parent run; without ``logging.mlflow`` every call is a no-op."""
        mlflow_cfg = cfg.logging.mlflow
        if mlflow_cfg is None:
            return cls(cfg, run_dir, None)
        run_id = state.read_ids(run_dir).get("mlflow", {}).get("run_id")
        parent = open_mlflow(mlflow_cfg, mlflow_cfg.run_name or cfg.name, run_id=run_id)
        if parent is not None:
            parent.log_params(config_params(dump_config(cfg)))
            parent.set_tags({"rayft.version": __version__, "rayft.pipeline": "true"})
            recorded = state.read_ids(run_dir).get("mlflow", {})
            state.write_ids(run_dir, "mlflow", {**recorded, "run_id": parent.run_id})
        return cls(cfg, run_dir, parent)

    @contextlib.contextmanager
    def stage(self, stage: str, fingerprint: str) -> Iterator[None]:
        """A nested run around one stage (reopened when an earlier attempt started it); the train
        stage's training logs into it. Ends FAILED when the stage raises."""
        if self.parent is None:
            yield
            return
        recorded = state.read_ids(self.run_dir).get("mlflow", {})
        stages = dict(recorded.get("stages", {}))
        run = open_mlflow(self.parent.cfg, stage, run_id=stages.get(stage), parent_id=self.parent.run_id)
        if run is None:
            yield
            return
        stages[stage] = run.run_id
        state.write_ids(self.run_dir, "mlflow", {**recorded, "stages": stages})
        run.set_tags({"rayft.stage": stage, "rayft.fingerprint": fingerprint, "rayft.version": __version__})
        self.parent.set_tags({f"rayft.fingerprint.{stage}": fingerprint})
        token = _STAGE_RUN.set(run.run_id)
        try:
            yield
        except BaseException:
            run.end("FAILED")
            raise
        finally:
            _STAGE_RUN.reset(token)
        self._current = run

    def stage_summary(self, stage: str, summary: dict[str, Any]) -> None:
        """Log a finished stage's summary (counts, acceptance, metrics with intervals, export checks)
        into its nested run and end it."""
        run = self._current
        if run is None:
            return
        self._current = None
        metrics, params = summary_metrics(summary)
        with _quiet(f"stage {stage} summary"):
            run.log_metrics(metrics)
            run.log_params({f"summary.{k}": v for k, v in params.items()})
            run.end("FINISHED")

    def finish(self, *, succeeded: bool, artifacts: dict[MlflowArtifact, Path], lineage: dict[str, Any]) -> None:
        """Tag the parent with the lineage hashes, upload the artifacts, end it. Never raises."""
        report_unsent(self.run_dir / "train")
        if self.parent is None:
            return
        with _quiet("the pipeline run"):
            tags = {f"rayft.lineage.{s['stage']}": s["fingerprint"] for s in lineage.get("stages", [])}
            self.parent.set_tags({**tags, "rayft.config_sha256": str(lineage.get("config_sha256"))})
            upload(self.parent, artifacts)
            self.parent.end("FINISHED" if succeeded else "FAILED")


@contextlib.contextmanager
def _quiet(what: str) -> Iterator[None]:
    """Turn a tracker error at the end of a stage or run into a warning."""
    try:
        yield
    except Exception as exc:
        log.warning("MLflow: could not log %s (%s: %s)", what, type(exc).__name__, str(exc).splitlines()[0][:200])
