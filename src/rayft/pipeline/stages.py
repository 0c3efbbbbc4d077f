"""The stages of ``rayft run``, one small object each: what its fingerprint covers
(:meth:`inputs`) and how it runs into its directory of the pipeline (:meth:`run`), returning the
files it produced and the summary its record keeps. Whether a stage runs at all is decided by
:func:`rayft.pipeline.plan.decide` from that fingerprint; the recipe carries it out.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig
from rayft.evaluation.gates import GateFailedError
from rayft.files import replace_dir, staging_dir
from rayft.pipeline.eval_plan import eval_stage_config
from rayft.pipeline.inputs import final_manifest_hash, local_files, model_identity, train_data_config
from rayft.pipeline.outputs import read_comparison
from rayft.pipeline.preference_plan import compare_sources
from rayft.pipeline.preference_stage import PairsStage, PreferenceStage
from rayft.pipeline.rl_stage import RlStage
from rayft.pipeline.stage import Stage, StageContext, StageOutput
from rayft.pipeline.training import run_training
from rayft.pipeline.tune_stage import TuneStage, adopt_trial_run, plan_train_handoff, tuned_config
from rayft.recipes import compare, evaluate, export, sdg
from rayft.runs.planner import StartPlan
from rayft.runs.records import trained_final
from rayft.runs.store import move_aside

log = logging.getLogger("rayft.run")


class SdgStage:
    """Synthetic data into ``sdg/`` (an interrupted run there resumes)."""

    name = "sdg"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The SDG section, the content of every local file it names, and the seed."""
        section = json.loads(ctx.cfg.sdg.model_dump_json())
        return {"sdg": section, "files": local_files(section), "seed": ctx.cfg.seed, "rayft": __version__}

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Generate the synthetic data."""
        out = ctx.run_dir / "sdg"
        if fresh:
            move_aside(out)
        result = sdg.run(ctx.cfg, output_dir=out)
        files = {
            "dir": result.output_dir,
            "data_parquet": result.data_parquet,
            "data_jsonl": result.data_jsonl,
            "rejected_jsonl": result.rejected_jsonl,
            "summary_json": result.summary_json,
        }
        return StageOutput(files, dict(result.summary))


class TrainStage:
    """Fine-tuning into ``train/`` (the mirror of ``<uri>/<name>/train/`` with a URI ``storage_path``)."""

    name = "train"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """Model, adapter, resolved data (with the synthetic data's hash), optimisation settings, world size;
        after a sweep, with the best trial's values."""
        cfg = tuned_config(ctx)
        data = json.loads(train_data_config(cfg, ctx.run_dir, ctx.records).model_dump_json())
        return {
            "model": model_identity(cfg),
            "lora": json.loads(cfg.lora.model_dump_json()),
            "data": data,
            "files": local_files(data),
            "train": json.loads(cfg.train.model_dump_json()),
            "num_workers": cfg.scaling.num_workers,
            "seed": cfg.seed,
            "rayft": __version__,
        }

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Train with the training driver, keeping a finished run with the same settings and resuming
        an unfinished one (:func:`rayft.runs.planner.plan_stage_start`); after a sweep, adopting its
        best trial's run when it trained the same thing."""
        out = ctx.run_dir / "train"
        if fresh:
            move_aside(out)
        train_cfg = train_stage_config(ctx)
        extra: dict[str, Any] = {}

        def adopt(plan: StartPlan, wanted: dict[str, Any]) -> StartPlan:
            handoff = plan_train_handoff(ctx, wanted)
            if handoff is None:
                return plan
            extra.update(handoff=handoff[0].action, handoff_reason=handoff[0].reason)
            log.info("stage train: after the sweep, %s", handoff[0].reason)
            if handoff[0].action == "reuse" and plan.action != "keep":
                adopt_trial_run(handoff[1], out, train_cfg)
                return StartPlan("keep", "the sweep's best trial trained it")
            return plan

        output = run_training(out, train_cfg, ctx.cfg.name, adopt=adopt)
        return StageOutput(output.files, output.summary | extra)


class EvalStage:
    """Base vs fine-tuned, SFT vs preference-trained after a preference stage, or the model alone, into ``eval/``."""

    name = "eval"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The eval section (with the environment it runs in), its local data files, the base model and the trained
        model's manifest hash."""
        section = json.loads(eval_stage_config(ctx.cfg).eval.model_dump_json())
        gates = {"gates": ctx.cfg.export.gate} if ctx.cfg.export.gate else {}  # their margins are tested here
        return {
            "eval": section,
            "files": local_files(section),
            "model": model_identity(ctx.cfg),
            "tuned": final_manifest_hash(ctx.run_dir, ctx.records),
            "rayft": __version__,
        } | gates

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Compare the base model with the fine-tuned one when the pipeline trains, else evaluate the model; in the
        environment the model trained in when the eval section names none (:mod:`rayft.pipeline.eval_plan`)."""
        out = ctx.run_dir / "eval"
        staging = staging_dir(out)
        cfg = eval_stage_config(ctx.cfg)
        if trained_final(ctx.run_dir, ctx.records) is None:
            single = evaluate.run(cfg, cfg.model.name, staging)
            replace_dir(staging, out)
            return StageOutput({"dir": out}, single.summary.to_dict())

        sources = compare_sources(cfg, ctx.run_dir, ctx.records)
        result = compare.run(cfg, sources, staging, gates=cfg.export.gate)
        replace_dir(staging, out)
        files = {
            "dir": out,
            "json": out / result.json_path.name,
            "markdown": out / result.markdown_path.name,
            "html": out / result.html_path.name,
            "examples": out / result.examples_path.name,
        }
        return StageOutput(files, result.summary.to_dict())


class ExportStage:
    """The fine-tuned model as a verified Hugging Face model directory in ``export/``."""

    name = "export"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The export section and the trained model's manifest hash; with gates, the comparison they read."""
        evidence = ctx.records.get("eval")
        gated = {"evidence": evidence.fingerprint if evidence else None} if ctx.cfg.export.gate else {}
        return {
            "export": json.loads(ctx.cfg.export.model_dump_json()),
            "model": model_identity(ctx.cfg),
            "tuned": final_manifest_hash(ctx.run_dir, ctx.records),
            "rayft": __version__,
        } | gated

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Check the promotion gates against the eval stage's comparison (a failed one stops here, before
        anything is exported), then export (merged or as an adapter) and verify."""
        out = ctx.run_dir / "export"
        comparison = read_comparison(ctx.run_dir, ctx.records) if ctx.cfg.export.gate else None
        if ctx.cfg.export.gate and comparison is None:
            raise GateFailedError("export.gate: the eval stage left no comparison to check the gates against")
        export.passed_gates(ctx.cfg, comparison)  # a failed gate stops the stage before the staging directory
        staging = staging_dir(out)
        final = str(trained_final(ctx.run_dir, ctx.records))
        result = export.run(ctx.cfg, final, staging, destination=out, comparison=comparison)
        replace_dir(staging, out)
        summary = {"merged": result.merged, **{f"verification.{k}": v for k, v in dict(result.verification).items()}}
        summary |= {f"gate.{g.gate}": g.evidence for g in result.gates}
        return StageOutput({"dir": out}, summary)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        SdgStage(),
        TuneStage(),
        TrainStage(),
        PairsStage(),
        PreferenceStage(),
        RlStage(),
        EvalStage(),
        ExportStage(),
    )
}
"""Every stage by name (the order they run in is :data:`rayft.pipeline.plan.STAGES`)."""


def train_stage_config(ctx: StageContext) -> RayftConfig:
    """The config of the train stage: the run ``train`` under the pipeline's directory (or URI); after
    a sweep, with the best trial's values (and no tune section)."""
    cfg = tuned_config(ctx)
    storage = ctx.location.storage_under()
    data = train_data_config(cfg, ctx.run_dir, ctx.records)
    return cfg.model_copy(update={"storage_path": storage, "name": "train", "data": data, "tune": None})
