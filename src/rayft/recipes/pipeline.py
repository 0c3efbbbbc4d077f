"""``rayft run CONFIG``: the whole pipeline — synthetic data, training, evaluation, export — on one Ray.

Reads top to bottom: resolve the run directory and the requested stages, start (or join) Ray once,
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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rayft import __version__
from rayft.config import DatasetConfig, RayftConfig, dump_config
from rayft.errors import ConfigError, StorageError
from rayft.pipeline.fingerprint import hash_file, hash_object, hash_path
from rayft.pipeline.lineage import build_lineage, relative, software_versions
from rayft.pipeline.plan import StageDecision, check_remote_stages, decide, requested_stages, runnable_stages
from rayft.pipeline.records import RECORDS_DIR, StageRecord, outputs_exist, read_record, write_record
from rayft.pipeline.report import ReportInputs, StageRow, render_report
from rayft.runs.location import RunLocation, is_remote, join_uri, plan_run_location
from rayft.runs.planner import plan_stage_start
from rayft.runs.store import RunStore, move_aside, open_store
from rayft.security import mask_uri

if TYPE_CHECKING:
    from rayft.recipes.train import TrainResult

log = logging.getLogger("rayft.run")

SDG_PATH = "stage:sdg"
"""A dataset path that stands for the synthetic data of this pipeline's ``sdg`` stage."""

CONFIG_FILE = "pipeline.yaml"
LINEAGE_FILE = "lineage.json"
REPORT_FILE = "report.html"


@dataclass
class PipelineResult:
    """What ``rayft run`` did: each stage's decision and record, and where the report is."""

    run_dir: Path
    decisions: list[StageDecision]
    records: dict[str, StageRecord]
    lineage_path: Path
    report_path: Path
    elapsed_s: dict[str, float] = field(default_factory=dict)


StageOutput = tuple[dict[str, Path], dict[str, Any]]


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
    from rayft.runtime import ray_runtime

    requested = requested_stages(cfg.model_fields_set)
    allowed, forced = runnable_stages(requested, from_stage=from_stage, only=only)
    forced = set(allowed) if force else forced
    location = pipeline_location(cfg)
    store = open_store(location)
    if store.remote_uri is not None:
        check_remote_stages(requested, location.display)
    run_dir = store.local_dir
    _write_text(run_dir / CONFIG_FILE, dump_config(cfg))

    decisions: list[StageDecision] = []
    records: dict[str, StageRecord] = {}
    elapsed: dict[str, float] = {}
    with ray_runtime(address or cfg.scaling.address):
        for stage in requested:
            inputs = STAGE_INPUTS[stage](cfg, run_dir, records)
            fingerprint = hash_object(inputs)
            recorded = read_record(run_dir, stage)
            usable = recorded if recorded is not None and outputs_exist(run_dir, recorded) else None
            decision = decide(
                stage, fingerprint, usable.fingerprint if usable else None, allowed=allowed, forced=forced
            )
            decisions.append(decision)
            if on_decision is not None:
                on_decision(decision)
            log.info("stage %s: %s (%s)", stage, decision.action, decision.reason)
            if decision.action != "run" and usable is not None:
                records[stage] = usable
                elapsed[stage] = 0.0
                continue
            started = time.time()
            try:
                outputs, summary = STAGE_RUNNERS[stage](cfg, run_dir, records, fresh=recorded is not None)
            except BaseException:
                elapsed[stage] = time.time() - started
                decisions[-1] = StageDecision(stage, "failed", decision.reason)
                _write_outputs(cfg, run_dir, decisions, records, elapsed)
                raise
            record = StageRecord(
                stage=stage,
                fingerprint=fingerprint,
                inputs=inputs,
                outputs={name: relative(run_dir, path) for name, path in outputs.items()},
                summary=summary,
                started_at=started,
                elapsed_s=time.time() - started,
            )
            write_record(run_dir, record)
            records[stage] = record
            elapsed[stage] = record.elapsed_s

    lineage_path, report_path = _write_outputs(cfg, run_dir, decisions, records, elapsed)
    persist_pipeline_files(store)
    return PipelineResult(run_dir, decisions, records, lineage_path, report_path, elapsed)


def pipeline_location(cfg: RayftConfig) -> RunLocation:
    """The pipeline's directory, or, with a URI as ``storage_path``, its URI and local mirror."""
    from rayft.cache import cache_root

    return plan_run_location(cfg.storage_path, cfg.name, cache_root())


def persist_pipeline_files(store: RunStore) -> None:
    """Make the pipeline's own files (config, stage records, lineage, report) durable beside ``train/``."""
    run_dir = store.local_dir
    names = [CONFIG_FILE, LINEAGE_FILE, REPORT_FILE]
    names += [f"{RECORDS_DIR}/{p.name}" for p in sorted((run_dir / RECORDS_DIR).glob("*.json"))]
    for rel in names:
        if (run_dir / rel).is_file():
            store.persist(rel)


def _write_outputs(
    cfg: RayftConfig,
    run_dir: Path,
    decisions: list[StageDecision],
    records: dict[str, StageRecord],
    elapsed: dict[str, float],
) -> tuple[Path, Path]:
    """Write lineage.json and report.html for the stages finished so far (also after a failure)."""
    lineage_path = run_dir / LINEAGE_FILE
    lineage = build_lineage(cfg.name, list(records.values()), hash_object(json.loads(cfg.model_dump_json())))
    _write_text(lineage_path, json.dumps(lineage, indent=2, sort_keys=True))
    report_path = run_dir / REPORT_FILE
    _write_text(report_path, render_report(report_inputs(cfg.name, run_dir, decisions, records, elapsed)))
    return lineage_path, report_path


# --- inputs: what each stage's fingerprint covers ------------------------------------------------------------


def sdg_inputs(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> dict[str, Any]:
    """The SDG section, the content of every local file it names, and the seed."""
    section = json.loads(cfg.sdg.model_dump_json())
    return {"sdg": section, "files": _local_files(section), "seed": cfg.seed, "rayft": __version__}


def train_inputs(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> dict[str, Any]:
    """Model, adapter, resolved data (with the synthetic data's hash), optimisation settings, world size."""
    data = json.loads(train_data_config(cfg, run_dir, records).model_dump_json())
    return {
        "model": model_identity(cfg),
        "lora": json.loads(cfg.lora.model_dump_json()),
        "data": data,
        "files": _local_files(data),
        "train": json.loads(cfg.train.model_dump_json()),
        "num_workers": cfg.scaling.num_workers,
        "seed": cfg.seed,
        "rayft": __version__,
    }


def eval_inputs(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> dict[str, Any]:
    """The eval section, its local data files, the base model and the trained model's manifest hash."""
    section = json.loads(cfg.eval.model_dump_json())
    return {
        "eval": section,
        "files": _local_files(section),
        "model": model_identity(cfg),
        "tuned": _final_manifest_hash(run_dir, records),
        "rayft": __version__,
    }


def export_inputs(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> dict[str, Any]:
    """The export section and the trained model's manifest hash."""
    return {
        "export": json.loads(cfg.export.model_dump_json()),
        "model": model_identity(cfg),
        "tuned": _final_manifest_hash(run_dir, records),
        "rayft": __version__,
    }


def model_identity(cfg: RayftConfig) -> dict[str, Any]:
    """The model section, plus the names, sizes and times of a local model directory's files."""
    identity: dict[str, Any] = {"config": json.loads(cfg.model.model_dump_json())}
    path = Path(cfg.model.name).expanduser()
    if path.exists():
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        identity["files"] = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return identity


def _final_manifest_hash(run_dir: Path, records: dict[str, StageRecord]) -> str | None:
    if "train" not in records:
        return None
    manifest = records["train"].output(run_dir, "final") / "rayft_checkpoint.json"
    return hash_file(manifest) if manifest.is_file() else None


def _local_files(section: Any) -> dict[str, str]:
    """The hash of every existing local path found under a ``path`` key of a config section."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "path" and isinstance(value, str) and "://" not in value and Path(value).exists():
                    found[value] = hash_path(Path(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(section)
    return found


def train_data_config(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> Any:
    """The data section training uses: the SDG output stands in for ``stage:sdg`` paths, and is the
    default training data when the config requests an ``sdg`` stage but writes no ``data`` section."""
    sdg_data = records["sdg"].output(run_dir, "data_jsonl") if "sdg" in records else None
    datasets = list(cfg.data.datasets)
    if "data" not in cfg.model_fields_set and sdg_data is not None:
        datasets = [
            DatasetConfig(
                path=SDG_PATH,
                name="sdg",
                format="template",
                input_template="Question: {question}\nAnswer:",
                output_template="{answer}",
            )
        ]
    resolved = []
    for ds in datasets:
        if ds.path == SDG_PATH:
            if sdg_data is None:
                raise ConfigError(
                    f"data.datasets: path {SDG_PATH!r} needs the sdg stage's output; add an `sdg:` section "
                    "or point the dataset at a file"
                )
            resolved.append(ds.model_copy(update={"path": str(sdg_data)}))
        else:
            resolved.append(ds)
    return cfg.data.model_copy(update={"datasets": resolved})


# --- runners: each stage's work ---------------------------------------------------------------------------------


def run_sdg(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord], *, fresh: bool) -> StageOutput:
    """Generate the synthetic data into ``sdg/`` (an interrupted run there resumes)."""
    from rayft.recipes import sdg

    out = run_dir / "sdg"
    if fresh:
        move_aside(out)
    result = sdg.run(cfg, output_dir=out)
    outputs = {
        "dir": result.output_dir,
        "data_parquet": result.data_parquet,
        "data_jsonl": result.data_jsonl,
        "rejected_jsonl": result.rejected_jsonl,
        "summary_json": result.summary_json,
    }
    return outputs, dict(result.summary)


def run_train(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord], *, fresh: bool) -> StageOutput:
    """Fine-tune into ``train/`` (the mirror of ``<uri>/<name>/train/`` with a URI ``storage_path``): the
    store's run with the same settings is kept when finished and resumed otherwise
    (:func:`rayft.runs.planner.plan_stage_start`)."""
    from rayft.recipes import train

    out = run_dir / "train"
    if fresh:
        move_aside(out)
    train_cfg = train_stage_config(cfg, run_dir, records)
    store = open_store(train.run_location(train_cfg, mirror_dir=out))
    store.probe()
    wanted = yaml.safe_load(dump_config(train_cfg))
    plan = plan_stage_start(
        store.where, cfg.name, store.state(), store.saved_config(), wanted, can_replace=store.can_replace
    )
    log.info("stage train: %s: %s", store.where, plan.reason)
    outputs = {"dir": out, "final": out / "final", "metrics": out / "metrics.jsonl"}
    final = store.final_manifest() if plan.action == "keep" else None
    if final is not None:
        summary = {"steps": final.step, "train_loss": final.metrics.get("train/loss"),
                   "eval_loss": final.metrics.get("eval/loss")}  # fmt: skip
        return outputs, summary | ({"storage_uri": mask_uri(store.remote_uri)} if store.remote_uri else {})
    if plan.action == "replace":
        move_aside(out)
    return outputs, train_summary(train.run(train_cfg, resume=plan.action == "resume", mirror_dir=out))


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


def train_stage_config(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> RayftConfig:
    """The config of the train stage: the run ``train`` under the pipeline's directory (or URI)."""
    storage = join_uri(cfg.storage_path, cfg.name) if is_remote(cfg.storage_path) else str(run_dir)
    data = train_data_config(cfg, run_dir, records)
    return cfg.model_copy(update={"storage_path": storage, "name": "train", "data": data})


def run_eval(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord], *, fresh: bool) -> StageOutput:
    """Compare the base model with the fine-tuned one (or evaluate the model alone) into ``eval/``."""
    out = run_dir / "eval"
    staging = _staging_dir(out)
    if "train" in records:
        from rayft.recipes.compare import compare_models

        sources = {"base": cfg.model.name, "tuned": str(records["train"].output(run_dir, "final"))}
        result = compare_models(cfg, sources, staging)
        _replace_dir(staging, out)
        summary = dict(result.summary)
        outputs = {
            "dir": out,
            "json": out / result.json_path.name,
            "markdown": out / result.markdown_path.name,
            "html": out / result.html_path.name,
            "examples": out / result.examples_path.name,
        }
        return outputs, summary
    from rayft.recipes.evaluate import evaluate_model

    single = evaluate_model(cfg, cfg.model.name, staging)
    _replace_dir(staging, out)
    return {"dir": out}, dict(getattr(single, "summary", {}) or {})


def run_export(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord], *, fresh: bool) -> StageOutput:
    """Export the fine-tuned model as a Hugging Face model directory into ``export/`` (verified)."""
    from rayft.recipes.export import export_model

    out = run_dir / "export"
    staging = _staging_dir(out)
    result = export_model(cfg, str(records["train"].output(run_dir, "final")), staging)
    _replace_dir(staging, out)
    summary = {"merged": result.merged, **{f"verification.{k}": v for k, v in dict(result.verification).items()}}
    return {"dir": out}, summary


StageInputs = Callable[[RayftConfig, Path, dict[str, StageRecord]], dict[str, Any]]
STAGE_INPUTS: dict[str, StageInputs] = {
    "sdg": sdg_inputs,
    "train": train_inputs,
    "eval": eval_inputs,
    "export": export_inputs,
}
STAGE_RUNNERS: dict[str, Callable[..., StageOutput]] = {
    "sdg": run_sdg,
    "train": run_train,
    "eval": run_eval,
    "export": run_export,
}


# --- the report --------------------------------------------------------------------------------------------------


def report_inputs(
    name: str,
    run_dir: Path,
    decisions: list[StageDecision],
    records: dict[str, StageRecord],
    elapsed: dict[str, float],
) -> ReportInputs:
    """Gather what the report shows from the stage records and the files they name."""
    rows = [
        StageRow(
            d.stage,
            d.action,
            d.reason,
            elapsed.get(d.stage) or (records[d.stage].elapsed_s if d.stage in records else 0.0),
        )
        for d in decisions
    ]
    metrics: list[dict[str, Any]] = []
    if "train" in records:
        path = records["train"].output(run_dir, "metrics")
        if path.is_file():
            metrics = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    compare: dict[str, Any] = {}
    examples: list[dict[str, Any]] = []
    if "eval" in records and "json" in records["eval"].outputs:
        compare = json.loads(records["eval"].output(run_dir, "json").read_text(encoding="utf-8"))
        if "examples" in records["eval"].outputs:
            lines = records["eval"].output(run_dir, "examples").read_text(encoding="utf-8").splitlines()
            examples = [json.loads(line) for line in lines if line.strip()]
    return ReportInputs(
        name=name,
        stages=rows,
        sdg_summary=records["sdg"].summary if "sdg" in records else {},
        train_metrics=metrics,
        train_summary=records["train"].summary if "train" in records else {},
        compare_summary=compare,
        examples=examples,
        export_summary=records["export"].summary if "export" in records else {},
        software=software_versions(),
    )


# --- files -------------------------------------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    """Write a file atomically (temp file beside it, then rename)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError as exc:
        raise StorageError(
            f"storage_path: cannot write {path} ({exc.strerror}); choose a writable directory with storage_path=..."
        ) from exc


def _staging_dir(target: Path) -> Path:
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _replace_dir(staging: Path, target: Path) -> None:
    """Put a finished stage directory in place of the old one (which is removed)."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(target)
