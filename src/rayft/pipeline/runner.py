"""``rayft run CONFIG``: the whole pipeline — synthetic data, training, evaluation, export — on one Ray.

Reads top to bottom: resolve the run directory and the requested stages, take the directory's lock,
start (or join) Ray once,
then for each stage compute the fingerprint of its inputs, skip it when its recorded outputs match,
run it otherwise and record what it produced; last, write ``lineage.json`` and ``report.html``.

::

    <storage_path>/<name>/
        pipeline.yaml        resolved config of the pipeline
        sdg/                 synthetic data (data.parquet, data.jsonl, rejected.jsonl, summary.json)
        train/               the training run (config.yaml, metrics.jsonl, checkpoints/, final/)
        eval/                base vs fine-tuned (compare.json, compare.md, compare.html, examples)
        export/              the exported Hugging Face model directory
        stages/<stage>.json  written last by each finished stage: fingerprint, inputs, outputs
        lineage.json         every artifact with the hashes of its inputs and the software versions
        report.html          what happened, readable offline

With a URI as ``storage_path`` only the train stage may run: it writes through a local mirror
(under the cache) and uploads to ``<uri>/<name>/train/``; the pipeline's records follow at the end.

The parts: which stages run (:mod:`rayft.pipeline.plan`), each stage's inputs and work
(:mod:`rayft.pipeline.stages`), its record (:mod:`rayft.runs.records`), and the pipeline's own
files (:mod:`rayft.pipeline.outputs`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.cache import cache_root
from rayft.config import RayftConfig, dump_config
from rayft.config.checks import check_config
from rayft.config.tracking import MlflowArtifact
from rayft.errors import ConfigError
from rayft.evaluation.gates import check_labels, parse_gates
from rayft.evaluation.summary import CompareSummary
from rayft.pipeline.fingerprint import hash_object
from rayft.pipeline.lineage import relative
from rayft.pipeline.outputs import (
    CONFIG_FILE,
    REPORT_FILE,
    PipelineProgress,
    persist_pipeline_files,
    read_comparison,
    write_outputs,
    write_text,
)
from rayft.pipeline.plan import StageDecision, decide, requested_stages, runnable_stages
from rayft.pipeline.preference_plan import compare_labels
from rayft.pipeline.stage import Stage, StageContext
from rayft.pipeline.stages import STAGES
from rayft.runs.layout import PROFILE_DIR, TRACKING_FILE
from rayft.runs.location import RunLocation, plan_run_location
from rayft.runs.lock import run_lock
from rayft.runs.records import RECORDS_DIR, StageRecord, outputs_exist, read_record, trained_final, write_record
from rayft.runs.store import open_store
from rayft.runtime import ray_runtime
from rayft.tracking.driver import PipelineTracker

log = logging.getLogger("rayft.run")


@dataclass(frozen=True)
class PipelineResult:
    """What ``rayft run`` did: each stage's decision and record, and where the report is."""

    run_dir: Path
    decisions: list[StageDecision]
    records: dict[str, StageRecord]
    lineage_path: Path
    report_path: Path
    elapsed_s: dict[str, float] = field(default_factory=dict)

    def comparison(self) -> CompareSummary | None:
        """The eval stage's base vs fine-tuned comparison (its compare.json), when there is one."""
        return read_comparison(self.run_dir, self.records)


def run(
    cfg: RayftConfig,
    *,
    from_stage: str | None = None,
    only: str | None = None,
    force: bool = False,
    address: str | None = None,
    on_decision: Callable[[StageDecision], None] | None = None,
) -> PipelineResult:
    """Run the stages the config requests, skipping those whose inputs did not change."""
    check_config(cfg, "run")  # every check of rayft run's that reads the config alone, as `config validate` does
    requested = requested_stages(cfg.model_fields_set)
    if "export" in requested and cfg.export.gate:
        check_export_gates(cfg, requested)
    allowed, forced = runnable_stages(requested, from_stage=from_stage, only=only)
    forced = set(allowed) if force else forced
    location = pipeline_location(cfg)
    store = open_store(location)
    run_dir = store.local_dir
    progress = PipelineProgress()
    ctx = StageContext(cfg, location, progress.records)
    with run_lock(run_dir, command="rayft run"):
        write_text(run_dir / CONFIG_FILE, dump_config(cfg))
        (run_dir / RECORDS_DIR).mkdir(exist_ok=True)  # marks a pipeline run even before a stage finishes
        store.fetch(TRACKING_FILE)  # the tracker runs of an earlier attempt, made on another machine
        tracker = PipelineTracker.start(cfg, run_dir)
        store.persist(TRACKING_FILE)
        with ray_runtime(address or cfg.scaling.address, metrics=cfg.logging.prometheus.enabled):
            for name in requested:
                decision, inputs = decide_stage(STAGES[name], ctx, allowed=allowed, forced=forced)
                progress.decisions.append(decision)
                if on_decision is not None:
                    on_decision(decision)
                log.debug("stage %s: %s (%s)", name, decision.action, decision.reason)
                if decision.action == "run":
                    run_stage(STAGES[name], inputs, ctx, progress, tracker=tracker)
                else:
                    progress.elapsed[name] = 0.0
        lineage_path, report_path = write_outputs(cfg, run_dir, progress)
        tracker.finish(
            succeeded=True, artifacts=tracked_artifacts(run_dir, progress.records), lineage=read_json(lineage_path)
        )
        persist_pipeline_files(store)
    return PipelineResult(run_dir, progress.decisions, progress.records, lineage_path, report_path, progress.elapsed)


def pipeline_location(cfg: RayftConfig) -> RunLocation:
    """The pipeline's directory, or, with a URI as ``storage_path``, its URI and local mirror."""
    return plan_run_location(cfg.storage_path, cfg.name, cache_root())


def decide_stage(
    stage: Stage, ctx: StageContext, *, allowed: list[str], forced: set[str]
) -> tuple[StageDecision, dict[str, Any]]:
    """Decide one stage from its inputs now and its record; return the decision and the inputs. A stage
    that is not run has its record adopted into ``ctx.records`` (later stages read its outputs)."""
    # A stage left out by --from/--only is not fingerprinted: its inputs may be outputs nothing made.
    inputs = stage.inputs(ctx) if stage.name in allowed else {}
    usable = usable_record(ctx.run_dir, stage.name)
    recorded = usable.fingerprint if usable else None
    decision = decide(stage.name, hash_object(inputs), recorded, allowed=allowed, forced=forced)
    if decision.action != "run" and usable is not None:
        ctx.records[stage.name] = usable
    return decision, inputs


def usable_record(run_dir: Path, stage: str) -> StageRecord | None:
    """The record of a finished stage whose outputs are all still there."""
    recorded = read_record(run_dir, stage)
    return recorded if recorded is not None and outputs_exist(run_dir, recorded) else None


def run_stage(
    stage: Stage,
    inputs: dict[str, Any],
    ctx: StageContext,
    progress: PipelineProgress,
    *,
    tracker: PipelineTracker | None = None,
) -> None:
    """Run one stage and write its record (``inputs`` and their fingerprint) last; on failure, mark it
    failed in the report and re-raise. With a ``tracker``, the stage runs in a nested run of its own."""
    fresh = read_record(ctx.run_dir, stage.name) is not None
    tracker = tracker or PipelineTracker(ctx.cfg, ctx.run_dir, None)
    started = time.time()
    try:
        with tracker.stage(stage.name, hash_object(inputs)):
            output = stage.run(ctx, fresh=fresh)
    except BaseException:
        progress.elapsed[stage.name] = time.time() - started
        last = progress.decisions[-1]
        progress.decisions[-1] = StageDecision(stage.name, "failed", last.reason)
        lineage_path, _ = write_outputs(ctx.cfg, ctx.run_dir, progress)
        artifacts = tracked_artifacts(ctx.run_dir, ctx.records)
        tracker.finish(succeeded=False, artifacts=artifacts, lineage=read_json(lineage_path))
        raise
    record = StageRecord(
        stage=stage.name,
        fingerprint=hash_object(inputs),
        inputs=inputs,
        outputs={name: relative(ctx.run_dir, path) for name, path in output.files.items()},
        summary=output.summary,
        started_at=started,
        elapsed_s=time.time() - started,
    )
    write_record(ctx.run_dir, record)
    ctx.records[stage.name] = record
    progress.elapsed[stage.name] = record.elapsed_s
    tracker.stage_summary(stage.name, output.summary)


def check_export_gates(cfg: RayftConfig, requested: list[str]) -> None:
    """Before anything runs: export.gate parses, names the eval stage's models, and has an eval stage to read."""
    gates = parse_gates(cfg.export.gate, where="export.gate")
    if "eval" not in requested:
        raise ConfigError(
            "export.gate is checked against the eval stage's comparison, and the config has no eval stage; "
            "add an `eval:` section (or remove export.gate)"
        )
    check_labels(gates, compare_labels(cfg, requested), where="export.gate")


def tracked_artifacts(run_dir: Path, records: dict[str, StageRecord]) -> dict[MlflowArtifact, Path]:
    """What a tracker may upload at the end of a pipeline (``logging.mlflow.artifacts`` picks): 'final'
    is the last trained model, preference training's when the pipeline ran it, else SFT's."""
    found: dict[MlflowArtifact, Path] = {"config": run_dir / CONFIG_FILE, "report": run_dir / REPORT_FILE}
    final = trained_final(run_dir, records)
    if final is not None:
        found["final"] = final
        profile = final.parent / PROFILE_DIR
        if profile.is_dir():
            found["profile"] = profile
    if "eval" in records and "json" in records["eval"].outputs:
        found["eval"] = records["eval"].output(run_dir, "json")
    if "export" in records:
        found["export"] = records["export"].output(run_dir, "dir")
    return found


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
