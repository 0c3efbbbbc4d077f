"""Generation with vLLM on GPUs (the ``vllm`` extra), optionally with a LoRA adapter.

vLLM is imported when a backend is built, never at module import; without it the error says
``pip install 'rayft[vllm]'``. Chat prompts are rendered with the model's chat template by
``LLM.chat``; the engine batches internally, so one call takes the whole batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.config.model import ModelConfig
from rayft.errors import MissingDependencyError, ModelError
from rayft.generation.backend import FinishReason, Generation, Prompt, SamplingParams, truncate_at_stop
from rayft.generation.hf import is_encoder_decoder
from rayft.models.loading import model_location


def import_vllm() -> Any:
    """The vllm module, or a MissingDependencyError with the install line."""
    try:
        import vllm
    except ImportError:
        raise MissingDependencyError("vllm", "vllm", "The vLLM generation backend") from None
    return vllm


def refuse_encoder_decoder(model: ModelConfig) -> None:
    """vLLM's engine serves decoder-only models; an encoder-decoder model (T5, BART) is refused here,
    before any GPU is taken, with the backend that generates with it."""
    if is_encoder_decoder(model):
        raise ModelError(
            f"model {model.name!r} is an encoder-decoder model, which the vLLM backend does not generate with; "
            "set eval.backend: hf (or sdg.teacher.backend: hf) to generate with transformers"
        )


class VLLMBackend:
    """One vLLM engine per process (per Ray actor); loads the model once."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        adapter_path: str | None = None,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
    ) -> None:
        refuse_encoder_decoder(model)
        vllm = import_vllm()

        location, kwargs = model_location(model)
        self._label = f"vllm:{model.name}" + (f"+{adapter_path}" if adapter_path else "")
        rank = adapter_max_rank(Path(adapter_path)) if adapter_path else None
        self.llm = vllm.LLM(
            **vllm_engine_args(
                model, location, kwargs.get("revision"), adapter_rank=rank,
                gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            )
        )  # fmt: skip
        self.lora = None
        if adapter_path:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, adapter_path)
        self._vllm = vllm

    @property
    def name(self) -> str:
        """The model (and adapter) this backend generates with."""
        return self._label

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Generation]:
        """Generate for every prompt in one engine call per prompt kind (text, chat)."""
        sampling = self._vllm.SamplingParams(**vllm_sampling_kwargs(params))
        out: list[Generation | None] = [None] * len(prompts)
        texts = [(i, p) for i, p in enumerate(prompts) if isinstance(p, str)]
        chats = [(i, p) for i, p in enumerate(prompts) if not isinstance(p, str)]
        if texts:
            results = self.llm.generate([p for _, p in texts], sampling, lora_request=self.lora, use_tqdm=False)
            for (i, _), result in zip(texts, results, strict=True):
                out[i] = to_generation(result, params)
        if chats:
            results = self.llm.chat([p for _, p in chats], sampling, lora_request=self.lora, use_tqdm=False)
            for (i, _), result in zip(chats, results, strict=True):
                out[i] = to_generation(result, params)
        return [g if g is not None else Generation("", finish_reason="error", error="no output") for g in out]


# The values vLLM accepts for max_lora_rank (LoRAConfig); 320 and 512 need a recent vLLM, older
# releases stop at 256.
VLLM_MAX_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def adapter_max_rank(adapter_dir: Path) -> int:
    """The largest LoRA rank in a PEFT adapter: its ``r`` and any per-module ``rank_pattern`` rank."""
    config_file = adapter_dir / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read the LoRA adapter's {config_file} ({exc}); point at a directory saved by PEFT "
            "(adapter_config.json beside the adapter weights)"
        ) from None
    ranks = [int(config.get("r", 8)), *(int(v) for v in (config.get("rank_pattern") or {}).values())]
    return max(ranks)


def vllm_engine_args(
    model: ModelConfig,
    location: str,
    revision: str | None,
    *,
    adapter_rank: int | None,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM``; with an adapter, ``max_lora_rank`` is its rank rounded
    up to a value vLLM accepts (vLLM's default, 16, refuses a rank-32 adapter)."""
    args: dict[str, Any] = {
        "model": location,
        "revision": revision,
        "trust_remote_code": model.trust_remote_code,
        "dtype": "auto" if model.dtype == "auto" else model.dtype,
        "enable_lora": adapter_rank is not None,
        "gpu_memory_utilization": gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
    }
    if adapter_rank is not None:
        fitting = [r for r in VLLM_MAX_LORA_RANKS if r >= adapter_rank]
        if not fitting:
            raise ModelError(
                f"the LoRA adapter has rank {adapter_rank}; vLLM serves adapters of rank at most "
                f"{VLLM_MAX_LORA_RANKS[-1]}: use the 'hf' backend (eval.backend=hf, or backend: hf in the generation "
                "section), or merge the adapter into the model at export"
            )
        args["max_lora_rank"] = fitting[0]
    return args


def vllm_sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """vLLM SamplingParams keyword arguments for our sampling parameters."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p if params.temperature > 0 else 1.0,
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    return kwargs


def to_generation(result: Any, params: SamplingParams) -> Generation:
    """A Generation from one vLLM RequestOutput."""
    completion = result.outputs[0]
    text, stopped = truncate_at_stop(str(completion.text), params.stop)
    finish: FinishReason = "length" if completion.finish_reason == "length" and not stopped else "stop"
    return Generation(
        text,
        num_prompt_tokens=len(result.prompt_token_ids or []),
        num_generated_tokens=len(completion.token_ids),
        finish_reason=finish,
    )
