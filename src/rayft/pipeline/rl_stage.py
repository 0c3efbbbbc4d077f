"""The ``rl`` stage of ``rayft run``: GRPO on the data's prompts, from the SFT model, into ``rl/``. Where it
starts is decided as for preference training (:func:`rayft.pipeline.preference_plan.plan_preference_start`):
a LoRA SFT adapter is merged into its base, and the RL run puts a fresh adapter on that."""

from __future__ import annotations

import json
from typing import Any

from rayft._version import __version__
from rayft.config import RayftConfig
from rayft.config.rl_stage import rl_data_section, rl_train_section
from rayft.pipeline.inputs import (
    final_manifest_hash,
    local_files,
    model_identity,
    stage_data_config,
    train_data_config,
)
from rayft.pipeline.preference_stage import train_after_sft
from rayft.pipeline.stage import StageContext, StageOutput


def rl_stage_config(ctx: StageContext, start_model: str, storage_path: str) -> RayftConfig:
    """The config of the RL training: run ``rl`` under ``storage_path``, the model ``start_model``, the train
    section with the stage's changes and ``objective: grpo``, and the prompts (the pipeline's data, with the
    stage's changes)."""
    cfg = ctx.cfg
    model = (
        cfg.model
        if start_model == cfg.model.name
        else cfg.model.model_copy(update={"name": start_model, "revision": None, "gguf_file": None})
    )
    # The stage's own datasets may name the SDG output too (stage:sdg): resolved after the merge.
    data = stage_data_config(rl_data_section(train_data_config(cfg, ctx.run_dir, ctx.records), cfg.rl), ctx.run_dir,
                             ctx.records)  # fmt: skip
    return cfg.model_copy(
        update={
            "name": "rl",
            "storage_path": storage_path,
            "model": model,
            "train": rl_train_section(cfg.train, cfg.rl),
            "data": data,
            "tune": None,
        }
    )


class RlStage:
    """GRPO after SFT into ``rl/``."""

    name = "rl"

    def inputs(self, ctx: StageContext) -> dict[str, Any]:
        """The stage's section, the train, data and LoRA sections it changes, the prompts' files, the model and
        the SFT model's manifest hash."""
        data = json.loads(train_data_config(ctx.cfg, ctx.run_dir, ctx.records).model_dump_json())
        return {
            "rl": json.loads(ctx.cfg.rl.model_dump_json()),
            "train": json.loads(ctx.cfg.train.model_dump_json()),
            "data": data,
            "files": local_files(data),
            "lora": json.loads(ctx.cfg.lora.model_dump_json()),
            "model": model_identity(ctx.cfg),
            "sft": final_manifest_hash(ctx.run_dir, ctx.records, "train"),
            "num_workers": ctx.cfg.scaling.num_workers,
            "seed": ctx.cfg.seed,
            "rayft": __version__,
        }

    def run(self, ctx: StageContext, *, fresh: bool) -> StageOutput:
        """Merge the SFT adapter when there is one, then train with GRPO from it."""
        return train_after_sft(
            ctx, ctx.run_dir / "rl", lambda start, storage: rl_stage_config(ctx, start, storage), fresh=fresh
        )
