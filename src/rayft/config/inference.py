"""Config section for using a model: ``rayft chat`` (in this process) and ``rayft generate`` (on Ray actors)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.data import DEFAULT_MAX_ROW_BYTES
from rayft.config.generation import (
    COMPILE_DESCRIPTION,
    KV_CACHE_DESCRIPTION,
    CompileSetting,
    EndpointConfig,
    KVCacheSetting,
    check_compile,
)

GENERATION_WINDOW = 4096
"""Prompts ordered and generated together by default: enough for batches of similar lengths, small
enough that a window's rows and results take a few MiB."""


class InferenceConfig(Section):
    """How ``rayft chat`` and ``rayft generate`` sample, and how ``rayft generate`` scales.

    The model is the command's SOURCE (a run directory picks its checkpoint with ``eval.checkpoint``);
    a LoRA checkpoint is applied to its base model, unmerged.
    """

    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf",
        description=(
            "Backend of rayft generate: 'hf' (transformers generate, CPU or GPU), 'vllm' (a GPU and "
            "pip install 'rayft[vllm]'), or 'openai' (an OpenAI-compatible server at inference.endpoint; "
            "SOURCE is sent as the model name). rayft chat always runs transformers in-process."
        ),
    )
    max_new_tokens: int = Field(512, gt=0, description="Longest reply or completion, in tokens.")
    temperature: float = Field(
        0.7, ge=0, description="Sampling temperature; 0 is greedy decoding (the same prompt, the same output)."
    )
    top_p: float = Field(0.9, gt=0, le=1, description="Nucleus sampling mass (with temperature > 0).")
    stop: list[str] = Field(default_factory=list, description="Stop sequences; a reply is cut before the first one.")
    seed: int | None = Field(None, description="Sampling seed (with temperature > 0); unset: a fresh one each run.")
    system_prompt: str | None = Field(
        None, description="System message a chat session starts with (/system changes it during the session)."
    )
    batch_size: int = Field(16, gt=0, description="Prompts per generate call (rayft generate).")
    max_row_bytes: int = Field(
        DEFAULT_MAX_ROW_BYTES,
        gt=0,
        description=(
            "Longest line of a rayft generate input, in bytes: a longer line is rejected (row_too_large, with "
            "its line and size, in the rejects file) without being held whole. Default 16 MiB."
        ),
    )
    window: int = Field(
        GENERATION_WINDOW,
        gt=0,
        description=(
            "rayft generate: prompts read, ordered longest first and generated together; the output is written "
            "a window at a time, in input order, so memory grows with the window, not with the input."
        ),
    )
    kv_cache: KVCacheSetting = Field("auto", description=f"rayft generate: {KV_CACHE_DESCRIPTION}")
    compile: CompileSetting = Field("auto", description=f"rayft generate: {COMPILE_DESCRIPTION}")
    num_workers: int = Field(1, gt=0, description="Generation actors (model replicas) on Ray.")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="CPUs reserved by each generation actor.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs reserved by each generation actor (0: CPU).")
    endpoint: EndpointConfig = Field(
        default_factory=EndpointConfig, description="The OpenAI-compatible server (backend 'openai' only)."
    )

    @model_validator(mode="after")
    def _check_compile(self) -> InferenceConfig:
        check_compile(self.kv_cache, self.compile)
        return self
