"""The two stages of ``rayft run`` after SFT: ``pairs`` (on-policy preference pairs sampled from the
trained model and verified) and ``preference`` (DPO, ORPO or SimPO on them, from the SFT model). What
each starts from is decided in :mod:`rayft.pipeline.preference_plan`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig
from rayft.files import replace_dir, staging_dir
from rayft.pipeline.fingerprint import hash_file
from rayft.pipeline.inputs import final_manifest_hash, local_files, model_identity
from rayft.pipeline.preference_plan import (
    pairs_model_source,
    plan_preference_start,
    preference_stage_config,
)
from rayft.pipeline.stage import StageContext, StageOutput
from rayft.pipeline.training import run_training
from rayft.recipes import export, pairs
from rayft.runs.store import move_aside

log = logging.getLogger("rayft.run")


class PairsStage:
    """Pairs sampled from the trained model (or ``pairs.model``) into ``pairs/``."""

    name = "pairs"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The pairs section, its local files, the seed, and the model sampled (the SFT model's manifest hash)."""
        section = json.loads(ctx.cfg.pairs.model_dump_json())
        return {
            "pairs": section,
            "files": local_files(section),
            "model": ctx.cfg.pairs.model or ("stage:train" if "train" in ctx.records else model_identity(ctx.cfg)),
            "sft": final_manifest_hash(ctx.run_dir, ctx.records, "train"),
            "seed": ctx.cfg.seed,
            "rayft": __version__,
        }

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Sample, verify and pair (Ray is running)."""
        out = ctx.run_dir / "pairs"
        if fresh:
            move_aside(out)
        source = pairs_model_source(ctx.cfg, ctx.run_dir, ctx.records)
        result = pairs.make(ctx.cfg, pairs.sampler_source(ctx.cfg, source), out)
        files = {"dir": out, "data_jsonl": result.data_jsonl, "no_pair_jsonl": result.no_pair_jsonl,
                 "summary_json": result.summary_json}  # fmt: skip
        return StageOutput(files, {**result.summary, "model": source})


class PreferenceStage:
    """Preference training on the pairs, from the SFT model, into ``preference/``."""

    name = "preference"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The stage's section, the train section it changes, the pairs' hash and the SFT model's manifest hash."""
        pairs_jsonl = ctx.records["pairs"].output(ctx.run_dir, "data_jsonl") if "pairs" in ctx.records else None
        return {
            "preference": json.loads(ctx.cfg.preference.model_dump_json()),
            "train": json.loads(ctx.cfg.train.model_dump_json()),
            "data": json.loads(ctx.cfg.data.model_dump_json(exclude={"datasets"})),
            "lora": json.loads(ctx.cfg.lora.model_dump_json()),
            "model": model_identity(ctx.cfg),
            "pairs": hash_file(pairs_jsonl) if pairs_jsonl is not None and pairs_jsonl.is_file() else None,
            "sft": final_manifest_hash(ctx.run_dir, ctx.records, "train"),
            "num_workers": ctx.cfg.scaling.num_workers,
            "seed": ctx.cfg.seed,
            "rayft": __version__,
        }

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Merge the SFT adapter when there is one, then train on the pairs from it."""
        pairs_jsonl = ctx.records["pairs"].output(ctx.run_dir, "data_jsonl")
        output = train_after_sft(
            ctx, ctx.run_dir / "preference", lambda start, storage: preference_stage_config(
                ctx.cfg, start, pairs_jsonl, storage), fresh=fresh,
        )  # fmt: skip
        return StageOutput(output.files, {**output.summary, "objective": ctx.cfg.preference.objective})


def train_after_sft(
    ctx: StageContext, out: Path, stage_config: Callable[[str, str], RayftConfig], *, fresh: bool
) -> StageOutput:
    """A training stage that starts from the SFT model (preference training, RL) into ``out``: the SFT
    adapter merged when there is one, then ``stage_config(start model, storage path)`` trained."""
    if fresh:
        move_aside(out)
    start = plan_preference_start(ctx.cfg, ctx.run_dir, ctx.records)
    log.info("stage %s: starts from %s (%s)", out.name, start.target, start.reason)
    if start.kind == "merge_adapter":
        merge_adapter(ctx, start.source, Path(start.target))
    storage = ctx.location.storage_under()
    output = run_training(out, stage_config(start.target, storage), ctx.cfg.name)
    files = dict(output.files)
    if start.kind == "merge_adapter":
        files["start"] = Path(start.target)
    return StageOutput(files, {**output.summary, "start": start.kind, "start_model": start.target})


def merge_adapter(ctx: StageContext, adapter: str, target: Path) -> None:
    """The SFT adapter merged into its base as a verified model directory at ``target`` (replaced whole)."""
    staging = staging_dir(target)
    export.run(ctx.cfg, adapter, staging, merge=True, destination=target)
    replace_dir(staging, target)
