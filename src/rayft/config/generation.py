"""Config section for a text generator (an SDG teacher, or the model under evaluation)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.model import ModelConfig

KVCacheSetting = Literal["auto", "dynamic", "static"]
CompileSetting = bool | Literal["auto"]
KV_CACHE_DESCRIPTION = (
    "KV cache of the 'hf' backend: 'dynamic' grows by one position per token; 'static' is allocated once per "
    "batch (longest prompt + max_new_tokens, rounded up to a few sizes) so that torch.compile can capture the "
    "decoding step; 'auto' is static on a GPU (for models transformers compiles as one graph) and dynamic on "
    "CPU, where static was no faster (docs/performance.md). Greedy completions are the same with either."
)
COMPILE_DESCRIPTION = (
    "torch.compile the decoding step of the 'hf' backend (needs a static cache). The first batch pays the "
    "compilation, and a short batch is filled up to batch_size so that one shape is compiled (sampled "
    "completions then differ from uncompiled ones; greedy ones do not). 'auto': on where kv_cache 'auto' "
    "would take the static cache (a GPU), off on CPU."
)


def check_compile(kv_cache: KVCacheSetting, compile: CompileSetting) -> None:
    """Refuse compilation with a dynamic cache, whose shapes change at every token."""
    if compile is True and kv_cache == "dynamic":
        raise ValueError(
            "compile true needs kv_cache 'static' (or 'auto'): a dynamic cache changes shape at every "
            "token, so the compiled step would recompile; set kv_cache: static or compile: false"
        )


class EndpointConfig(Section):
    """An OpenAI-compatible HTTP endpoint (backend 'openai'): where it is and how hard to try."""

    base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        description="Base URL up to and including /v1; /completions and /chat/completions are appended.",
    )
    api_key_env: str | None = Field(
        "OPENAI_API_KEY",
        description="Environment variable holding the API key sent as a Bearer token (none sent when unset or empty).",
    )
    timeout_s: float = Field(60.0, gt=0, description="Seconds to wait for one HTTP response.")
    max_retries: int = Field(
        5, ge=0, description="Retries of one request after HTTP 429, 5xx, a timeout or a dropped connection."
    )
    backoff_s: float = Field(
        0.5,
        ge=0,
        description="First retry delay in seconds; it doubles on each retry (with jitter), or follows Retry-After.",
    )
    max_concurrency: int = Field(8, gt=0, description="Requests in flight at once, per generation actor.")


class GenerationConfig(Section):
    """Which backend generates, with which model, how it samples, and how it scales on Ray Data."""

    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf",
        description=(
            "Generation backend: 'hf' (transformers generate, batched, CPU or GPU), 'vllm' (needs a "
            "GPU and pip install 'rayft[vllm]'), or 'openai' (any OpenAI-compatible HTTP endpoint, "
            "see endpoint; model.name is sent as the model)."
        ),
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
    kv_cache: KVCacheSetting = Field("auto", description=KV_CACHE_DESCRIPTION)
    compile: CompileSetting = Field("auto", description=COMPILE_DESCRIPTION)
    concurrency: int = Field(1, gt=0, description="Generation actors (model replicas) in the Ray Data actor pool.")
    num_cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved by each actor.")
    num_gpus_per_actor: float = Field(0.0, ge=0, description="GPUs reserved by each actor (0 runs on CPU).")
    endpoint: EndpointConfig = Field(
        default_factory=EndpointConfig, description="The HTTP endpoint (backend 'openai' only)."
    )

    @model_validator(mode="after")
    def _check_compile(self) -> GenerationConfig:
        check_compile(self.kv_cache, self.compile)
        return self
