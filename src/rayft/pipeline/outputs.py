"""The pipeline's own files: its config, ``lineage.json`` and ``report.html``, written from the stage
records after every stage (also after a failure), and made durable by the run's store."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.data.builtin import builtin_eval_note
from rayft.evaluation.summary import CompareSummary
from rayft.files import write_text_atomic
from rayft.pipeline.fingerprint import hash_object
from rayft.pipeline.lineage import build_lineage, software_versions
from rayft.pipeline.plan import StageDecision
from rayft.pipeline.report import ReportInputs, StageRow, render_report
from rayft.runs.layout import TRACKING_FILE
from rayft.runs.records import RECORDS_DIR, StageRecord
from rayft.runs.store import RunStore
from rayft.training.profiling.report import profile_section, read_profile

CONFIG_FILE = "pipeline.yaml"
LINEAGE_FILE = "lineage.json"
REPORT_FILE = "report.html"


@dataclass
class PipelineProgress:
    """What happened so far: each requested stage's decision, the records of finished stages, and
    the seconds each took (0 for a skipped one)."""

    decisions: list[StageDecision] = field(default_factory=list)
    records: dict[str, StageRecord] = field(default_factory=dict)
    elapsed: dict[str, float] = field(default_factory=dict)


def write_outputs(cfg: RayftConfig, run_dir: Path, progress: PipelineProgress) -> tuple[Path, Path]:
    """Write lineage.json and report.html for the stages finished so far."""
    lineage_path = run_dir / LINEAGE_FILE
    lineage = build_lineage(cfg.name, list(progress.records.values()), hash_object(json.loads(cfg.model_dump_json())))
    write_text(lineage_path, json.dumps(lineage, indent=2, sort_keys=True))
    report_path = run_dir / REPORT_FILE
    inputs = report_inputs(cfg.name, run_dir, progress)
    seeds = [cfg.sdg.seeds.path] if "sdg" in cfg.model_fields_set else []
    note = builtin_eval_note([ds.path for ds in cfg.eval.datasets], seeds) or ""
    write_text(report_path, render_report(dataclasses.replace(inputs, headline_note=note)))
    return lineage_path, report_path


def read_comparison(run_dir: Path, records: dict[str, StageRecord]) -> CompareSummary | None:
    """The comparison the eval stage recorded (``eval/compare.json``), or None without one."""
    if "eval" not in records or "json" not in records["eval"].outputs:
        return None
    path = records["eval"].output(run_dir, "json")
    return CompareSummary.from_dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else None


def stage_metrics(run_dir: Path, records: dict[str, StageRecord], stage: str) -> list[dict[str, Any]]:
    """The metrics.jsonl records of a training stage (none when it did not run or wrote none)."""
    path = records[stage].output(run_dir, "metrics") if stage in records else None
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def report_inputs(name: str, run_dir: Path, progress: PipelineProgress) -> ReportInputs:
    """Gather what the report shows from the stage records and the files they name."""
    records, elapsed = progress.records, progress.elapsed
    rows = [
        StageRow(
            d.stage,
            d.action,
            d.reason,
            elapsed.get(d.stage) or (records[d.stage].elapsed_s if d.stage in records else 0.0),
        )
        for d in progress.decisions
    ]
    metrics, rl_metrics = stage_metrics(run_dir, records, "train"), stage_metrics(run_dir, records, "rl")
    profile = read_profile(records["train"].output(run_dir, "metrics").parent) if "train" in records else None
    compare = read_comparison(run_dir, records)
    examples: list[dict[str, Any]] = []
    if compare is not None and "examples" in records["eval"].outputs:
        lines = records["eval"].output(run_dir, "examples").read_text(encoding="utf-8").splitlines()
        examples = [json.loads(line) for line in lines if line.strip()]
    return ReportInputs(
        name=name,
        stages=rows,
        sdg_summary=records["sdg"].summary if "sdg" in records else {},
        train_metrics=metrics,
        train_summary=records["train"].summary if "train" in records else {},
        rl_metrics=rl_metrics,
        rl_summary=records["rl"].summary if "rl" in records else {},
        compare_summary=compare,
        examples=examples,
        export_summary=records["export"].summary if "export" in records else {},
        software=software_versions(),
        profile_section=profile_section(profile) if profile is not None else "",
    )


def persist_pipeline_files(store: RunStore) -> None:
    """Make the pipeline's own files (config, stage records, lineage, report) durable beside ``train/``."""
    run_dir = store.local_dir
    names = [CONFIG_FILE, LINEAGE_FILE, REPORT_FILE, TRACKING_FILE]
    names += [f"{RECORDS_DIR}/{p.name}" for p in sorted((run_dir / RECORDS_DIR).glob("*.json"))]
    for rel in names:
        if (run_dir / rel).is_file():
            store.persist(rel)


def write_text(path: Path, text: str) -> None:
    """Write one of the pipeline's files atomically (a write error names storage_path)."""
    write_text_atomic(path, text, where="storage_path", fix="choose a writable directory with storage_path=...")
