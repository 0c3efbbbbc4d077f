"""Training a model as a stage of ``rayft run`` (SFT in ``train/``, preference training in
``preference/``): keep a finished run with the same settings, resume an unfinished one, replace one
made with other settings, and what the stage's record keeps of it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rayft.config import RayftConfig, dump_config
from rayft.models.architecture import refuse_quantize_widths
from rayft.pipeline.stage import StageOutput
from rayft.runs import layout
from rayft.runs.planner import StartPlan, plan_stage_start
from rayft.runs.store import RunStore, move_aside, open_store
from rayft.training.driver.run import RunStart, default_launcher, drive
from rayft.training.driver.startup import run_location

if TYPE_CHECKING:
    from rayft.training.driver.run import TrainResult

log = logging.getLogger("rayft.run")


def run_training(
    out: Path,
    train_cfg: RayftConfig,
    pipeline_name: str,
    *,
    adopt: Callable[[StartPlan, dict[str, Any]], StartPlan] | None = None,
) -> StageOutput:
    """Train ``train_cfg`` into the stage directory ``out``: keep a finished run with the same settings,
    resume an unfinished one, replace one with other settings (``adopt`` may change that plan first)."""
    if train_cfg.task.path is None:  # before the stage's run directory is touched
        refuse_quantize_widths(train_cfg.model, train_cfg.lora.quantize)
    location = run_location(train_cfg, mirror_dir=out)
    store = open_store(location)
    store.probe()
    wanted = yaml.safe_load(dump_config(train_cfg))
    plan = plan_stage_start(
        store.where, pipeline_name, store.state(), store.saved_config(), wanted, can_replace=store.can_replace
    )
    if adopt is not None:
        plan = adopt(plan, wanted)
    log.info("stage %s: %s: %s", out.name, store.where, plan.reason)
    files = {"dir": out, "final": out / layout.FINAL_DIR, "metrics": out / layout.METRICS_FILE}
    kept = kept_summary(store) if plan.action == "keep" else None
    if kept is not None:
        return StageOutput(files, kept)
    if plan.action == "replace":
        move_aside(out)
    start = RunStart(resume=plan.action == "resume")
    trained = drive(train_cfg, default_launcher(train_cfg), location, start=start)
    return StageOutput(files, train_summary(trained))


def kept_summary(store: RunStore) -> dict[str, Any] | None:
    """The summary of a finished training run kept as it is (None when its final/ cannot be read)."""
    final = store.final_manifest()
    if final is None:
        return None
    summary = {"steps": final.step, "train_loss": final.metrics.get("train/loss"),
               "eval_loss": final.metrics.get("eval/loss")}  # fmt: skip
    return summary | ({"storage_uri": store.shown_uri} if store.shown_uri else {})


def train_summary(result: TrainResult) -> dict[str, Any]:
    """What the train stage's record keeps of a finished training run."""
    summary: dict[str, Any] = {
        "steps": result.steps,
        "train_loss": result.train_loss,
        "eval_loss": result.eval_loss,
        "data_key": result.data_key,
        "seconds": round(result.elapsed_s, 1),
    }
    if result.storage_uri:
        summary["storage_uri"] = result.storage_uri
    return summary
