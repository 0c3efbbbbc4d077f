"""``rayft export SRC OUTPUT_DIR [--no-merge]``: a checkpoint becomes a verified Hugging Face model.

Reads top to bottom: plan the export (resolve the source, a run directory picking its checkpoint;
refuse a model or a non-empty target), then carry it out (:func:`rayft.export.build.export_checkpoint`:
check the adapter, compare logits on probe prompts, save, reload and generate, write the model card,
and only then move the finished directory into place).

Public entry point: :func:`run` (also ``rayft.api.export``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.errors import ConfigError
from rayft.evaluation.gates import check_gates, parse_gates, read_compare_json, require_passed
from rayft.evaluation.summary import CompareSummary, GateResult
from rayft.export.build import export_checkpoint
from rayft.export.plan import plan_export

log = logging.getLogger("rayft.export")


@dataclass(frozen=True)
class ExportResult:
    """The exported directory, whether LoRA was merged, what verification measured, and the promotion
    gates it passed."""

    output_dir: Path
    merged: bool
    kind: str
    verification: dict[str, Any]
    gates: list[GateResult] = field(default_factory=list)


def run(
    cfg: RayftConfig,
    source: str,
    output_dir: Path,
    *,
    merge: bool | None = None,
    destination: Path | None = None,
    comparison: CompareSummary | None = None,
) -> ExportResult:
    """Export the checkpoint ``source`` (or a run directory's chosen checkpoint) to ``output_dir``.

    ``destination``: where the caller moves ``output_dir`` once this returns (the pipeline's export
    stage writes into a staging directory, then renames it into place); the log line names it.
    With ``export.gate``, every gate must pass against ``comparison`` (the pipeline's eval stage's),
    or else ``export.gate_report``, before anything loads; the model card states their evidence.
    """
    merge = cfg.export.merge if merge is None else merge
    passed = passed_gates(cfg, comparison)
    plan = plan_export(source, output_dir, cfg.model, cfg.eval.checkpoint, merge=merge)
    if cfg.export.format == "gguf" and plan.kind == "lora" and not plan.merge:
        raise ConfigError(
            "export.format gguf needs merged weights but export.merge is false (--no-merge): "
            "drop --no-merge, or export format hf"
        )
    # GGUF files are named after the directory the export ends in, not a staging directory it is written to
    verification = export_checkpoint(plan, cfg.export, gates=passed, name=(destination or plan.target).name)
    log.info("exported %s to %s", plan.source.checkpoint_dir, destination or plan.target)
    return ExportResult(plan.target, plan.merged, plan.kind, verification, passed)


def passed_gates(cfg: RayftConfig, comparison: CompareSummary | None) -> list[GateResult]:
    """The results of ``export.gate`` (all passed), or a one-line error: a bad gate, no evidence, a failed gate."""
    if not cfg.export.gate:
        return []
    gates = parse_gates(cfg.export.gate, where="export.gate")
    if comparison is None:
        if cfg.export.gate_report is None:
            raise ConfigError(
                "export.gate needs the comparison it is checked against: set export.gate_report=PATH/compare.json "
                "(written by rayft compare), or export through rayft run, whose eval stage compares"
            )
        comparison = read_compare_json(cfg.export.gate_report, "export.gate_report")
    results = check_gates(gates, comparison)
    require_passed(results, "export")
    return results


export_model = run  # the recipe's former name
