"""Building a generation backend from its config section (one table, no if/elif chains)."""

from __future__ import annotations

from collections.abc import Callable

from rayft.config.generation import GenerationConfig
from rayft.config.inference import InferenceConfig
from rayft.generation.backend import GenerationBackend, SamplingParams
from rayft.generation.hf import HFBackend
from rayft.generation.openai_http import OpenAIBackend
from rayft.generation.vllm import VLLMBackend


def _hf(cfg: GenerationConfig) -> GenerationBackend:
    device = "cuda" if cfg.num_gpus_per_actor > 0 else "cpu"
    return HFBackend(
        cfg.model,
        adapter_path=cfg.adapter_path,
        device=device,
        batch_size=cfg.batch_size,
        kv_cache=cfg.kv_cache,
        compile=cfg.compile,
    )


def _vllm(cfg: GenerationConfig) -> GenerationBackend:
    return VLLMBackend(cfg.model, adapter_path=cfg.adapter_path)


def _openai(cfg: GenerationConfig) -> GenerationBackend:
    return OpenAIBackend(cfg.model.name, cfg.endpoint)


BACKENDS: dict[str, Callable[[GenerationConfig], GenerationBackend]] = {"hf": _hf, "vllm": _vllm, "openai": _openai}


def build_backend(cfg: GenerationConfig) -> GenerationBackend:
    """Construct the backend named by ``cfg.backend`` (loads the model)."""
    return BACKENDS[cfg.backend](cfg)


def sampling_params(cfg: GenerationConfig | InferenceConfig) -> SamplingParams:
    """The sampling parameters of a generation config (or of the inference section, which has the same)."""
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        stop=tuple(cfg.stop),
        seed=cfg.seed,
    )
