"""How SFT hands over to preference training in ``rayft run``: pure decisions, no I/O.

The pipeline trains (``train``, SFT), samples pairs from what it trained (``pairs``: on-policy), then
trains on the pairs (``preference``) starting from the SFT model. A LoRA SFT result is merged into its
base first: the preference training then puts a fresh adapter on the SFT model, and DPO's reference
(the model with the adapter disabled) is the SFT model itself, not the base before SFT. A full SFT
result is a model directory already. Without a train stage, both start from ``model.name``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rayft.config import RayftConfig
from rayft.config.data import DatasetConfig
from rayft.config.pairs import preference_data_section, preference_train_section
from rayft.runs.records import StageRecord

START_DIR = "sft-merged"
"""The pipeline's directory of the merged SFT model a LoRA preference training starts from."""

StartKind = Literal["merge_adapter", "model_dir", "model"]


@dataclass(frozen=True)
class PreferenceStart:
    """Where the preference training starts: ``merge_adapter`` (the SFT adapter at ``source`` is merged
    into ``target`` first), ``model_dir`` (a full SFT model directory) or ``model`` (the configured model)."""

    kind: StartKind
    source: str
    target: str
    reason: str


def pairs_model_source(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> str:
    """The model the pairs are sampled from: ``pairs.model``, else what the train stage trained (the
    pairs are then on-policy for the preference training that starts from it), else ``model.name``."""
    if cfg.pairs.model:
        return cfg.pairs.model
    if "train" in records:
        return str(records["train"].output(run_dir, "final"))
    return cfg.model.name


def plan_preference_start(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> PreferenceStart:
    """Where the preference training starts (see the module's docstring)."""
    if "train" not in records:
        return PreferenceStart("model", cfg.model.name, cfg.model.name, "no train stage: from model.name")
    final = str(records["train"].output(run_dir, "final"))
    if cfg.train.method == "lora":
        target = str(run_dir / START_DIR)
        reason = "the SFT adapter merged into its base (a reference model is then the SFT model)"
        return PreferenceStart("merge_adapter", final, target, reason)
    return PreferenceStart("model_dir", final, final, "the fully fine-tuned SFT model")


def pairs_dataset(pairs_jsonl: Path, cfg: RayftConfig) -> DatasetConfig:
    """The pairs as the preference training's dataset, rendered as they were sampled (chat or raw text)."""
    return DatasetConfig(
        path=str(pairs_jsonl),
        name="pairs",
        use_chat_template=cfg.pairs.use_chat_template,
        system_prompt=cfg.pairs.system_prompt if cfg.pairs.use_chat_template else None,
    )


def preference_stage_config(cfg: RayftConfig, start_model: str, pairs_jsonl: Path, storage_path: str) -> RayftConfig:
    """The config of the preference training: run ``preference`` under ``storage_path``, the model
    ``start_model``, the train section with the stage's changes and objective, and the pairs as data."""
    model = cfg.model if start_model == cfg.model.name else cfg.model.model_copy(
        update={"name": start_model, "revision": None, "gguf_file": None}
    )  # fmt: skip
    return cfg.model_copy(
        update={
            "name": "preference",
            "storage_path": storage_path,
            "model": model,
            "train": preference_train_section(cfg.train, cfg.preference),
            "data": preference_data_section(cfg.data, cfg.preference, pairs_dataset(pairs_jsonl, cfg)),
            "tune": None,
        }
    )


def compare_sources(cfg: RayftConfig, run_dir: Path, records: dict[str, StageRecord]) -> dict[str, str]:
    """What the eval stage compares: after preference training or RL, the model it started from against it
    (SFT vs SFT + DPO, or SFT vs SFT + GRPO, on the same problems, with the paired test); else the base
    against the SFT model."""
    after = next(((s, name) for s, name in (("preference", cfg.preference.objective), ("rl", "grpo")) if s in records),
                 None)  # fmt: skip
    if after is not None:
        before = (
            ("sft", str(records["train"].output(run_dir, "final"))) if "train" in records else ("base", cfg.model.name)
        )
        return {before[0]: before[1], after[1]: str(records[after[0]].output(run_dir, "final"))}
    return {"base": cfg.model.name, "tuned": str(records["train"].output(run_dir, "final"))}


def compare_labels(cfg: RayftConfig, stages: Collection[str]) -> tuple[str, str]:
    """The labels :func:`compare_sources` gives the eval stage's two models when ``stages`` all run."""
    before = "sft" if "train" in stages else "base"
    if "preference" in stages:
        return before, cfg.preference.objective
    if "rl" in stages:
        return before, "grpo"
    return "base", "tuned"
