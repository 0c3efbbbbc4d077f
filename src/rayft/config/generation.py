"""Config section for a text generator (an SDG teacher, or the model under evaluation)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rayft.config.base import Section
from rayft.config.model import ModelConfig


class GenerationConfig(Section):
    """Which backend generates, with which model, how it samples, and how it scales on Ray Data."""

    backend: Literal["hf"] = Field(
        "hf",
        description="Generation backend: 'hf' (transformers generate, batched, CPU or GPU).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The generating model.")
    adapter_path: str | None = Field(
        None, description="A LoRA adapter directory applied on top of the model, unmerged."
    )
    max_new_tokens: int = Field(256, gt=0, description="Longest completion, in tokens.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature; 0 is greedy decoding.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (with temperature > 0).")
    stop: list[str] = Field(
        default_factory=list, description="Stop sequences; the completion is cut before the first one."
    )
    seed: int | None = Field(None, description="Sampling seed (with temperature > 0).")
    batch_size: int = Field(16, gt=0, description="Prompts per generate call (and per Ray Data batch).")
    concurrency: int = Field(1, gt=0, description="Generation actors (model replicas) in the Ray Data actor pool.")
    num_cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved by each actor.")
    num_gpus_per_actor: float = Field(0.0, ge=0, description="GPUs reserved by each actor (0 runs on CPU).")
