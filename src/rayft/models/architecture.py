"""Whether a model is a causal LM or an encoder-decoder, read from its config without loading weights.

A local directory's ``config.json`` is read as JSON (no transformers import); a Hub model's config is
fetched by transformers. The built-in models and GGUF files are causal LMs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from rayft.config.model import ModelConfig
from rayft.errors import ConfigError, ModelError
from rayft.models.hub import check_model_available, read_model_config
from rayft.models.resolve import resolve_model_source

Kind = Literal["causal", "seq2seq"]

# LoRA targets named explicitly for encoder-decoder families whose linear layers are known: every
# attention projection and both feed-forward matrices (T5 v1.1, Flan-T5 and mT5 gate theirs: wi_0, wi_1).
SEQ2SEQ_LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "t5": ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"),
    "mt5": ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"),
    "umt5": ("q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"),
    "bart": ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"),
    "mbart": ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"),
}


def model_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The model's config as a dict ({} for the built-in models and GGUF files, which are causal LMs)."""
    source = resolve_model_source(cfg.name, cfg.gguf_file, cfg.revision)
    if source.kind == "builtin" or source.gguf_file:
        return {}
    return dict(_config_dict(source.location, source.kind, cfg.revision, cfg.trust_remote_code))


@functools.cache
def _config_dict(location: str, kind: str, revision: str | None, trust_remote_code: bool) -> dict[str, Any]:
    if (Path(location) / "config.json").is_file():
        return dict(read_model_config(Path(location)))
    if kind != "hub":
        return {}
    from transformers import AutoConfig

    check_model_available(location)  # offline and not cached: refused at once, with what this machine has
    try:
        config = AutoConfig.from_pretrained(location, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"model.name: could not read the config of {location!r}: {exc}; check the name") from exc
    return dict(config.to_dict())


def context_tokens(config: Mapping[str, Any]) -> int | None:
    """The longest sequence (prompt and completion) a model takes, from its config (``max_position_embeddings``;
    GPT-2's family says ``n_positions``); None when it does not say. T5's ``n_positions`` is no limit (its
    positions are relative), so it counts for causal LMs only. What `rayft serve` holds each request to, and
    a rollout's length is checked against before a run starts."""
    value = config.get("max_position_embeddings")
    if not isinstance(value, int) and not config.get("is_encoder_decoder"):
        value = config.get("n_positions")
    return int(value) if isinstance(value, int) else None


def resolve_architecture(cfg: ModelConfig) -> Kind:
    """'seq2seq' or 'causal': ``model.architecture`` when set, else the config's ``is_encoder_decoder``."""
    if cfg.architecture != "auto":
        return cfg.architecture
    return "seq2seq" if model_config_dict(cfg).get("is_encoder_decoder") else "causal"


def model_type(cfg: ModelConfig) -> str:
    """The transformers ``model_type`` of the model ('t5', 'bart', 'llama', ...; '' when unknown)."""
    return str(model_config_dict(cfg).get("model_type", ""))


def refuse_packing(cfg: ModelConfig, packing: bool) -> None:
    """ConfigError when ``data.packing`` is on for an encoder-decoder model."""
    if packing and resolve_architecture(cfg) == "seq2seq":
        raise ConfigError(
            f"data.packing=true: model.name={cfg.name!r} is an encoder-decoder model, whose encoder input and "
            "decoder targets are separate sequences that cannot be concatenated with others'; set "
            "data.packing=false (batches are padded instead)"
        )


QUANTIZED_WIDTH_MULTIPLE = 64
"""bitsandbytes' 4-bit and 8-bit linear layers need input widths that are multiples of this."""
_LINEAR_INPUT_WIDTHS = ("hidden_size", "intermediate_size", "d_model", "d_ff")  # the widths linear layers take in


def refuse_quantize_widths(cfg: ModelConfig, quantize: str) -> None:
    """ConfigError when ``lora.quantize`` is on for a model whose linear layers' input widths (hidden and
    feed-forward sizes, from its config) are not multiples of :data:`QUANTIZED_WIDTH_MULTIPLE`: refused
    before any training starts, instead of failing inside bitsandbytes once the workers load the model."""
    if quantize == "none":
        return
    config = model_config_dict(cfg)
    widths = {key: config[key] for key in _LINEAR_INPUT_WIDTHS if isinstance(config.get(key), int)}
    bad = {key: width for key, width in widths.items() if width % QUANTIZED_WIDTH_MULTIPLE}
    if bad:
        listed = ", ".join(f"{key}={width}" for key, width in bad.items())
        raise ConfigError(
            f"lora.quantize={quantize!r}: model.name={cfg.name!r} has {listed}, and bitsandbytes' quantized linear "
            f"layers need input widths that are multiples of {QUANTIZED_WIDTH_MULTIPLE}; use a model whose widths "
            "are, or lora.quantize=none"
        )


FP16_UNSAFE = ("t5", "mt5", "umt5")
"""transformers model types whose activations overflow float16 (T5's feed-forward outputs exceed 65504)."""


def check_float16(model_type: str, setting: str) -> None:
    """ConfigError when float16 (named by ``setting``) is asked for a model type in :data:`FP16_UNSAFE`."""
    if model_type in FP16_UNSAFE:
        raise ConfigError(
            f"{setting}: {model_type} models overflow in float16 (their feed-forward activations exceed 65504 "
            "and the loss becomes inf or nan); use bf16 (train.mixed_precision=bf16, on a GPU that has it) or "
            "full precision (train.mixed_precision=no)"
        )


def refuse_fp16(cfg: ModelConfig, mixed_precision: str) -> None:
    """ConfigError when ``train.mixed_precision`` or ``model.dtype`` asks float16 for a model family
    that overflows in it (T5, mT5; see :func:`check_float16`)."""
    if mixed_precision == "fp16":
        check_float16(model_type(cfg), f"train.mixed_precision=fp16 for model.name={cfg.name!r}")
    if cfg.dtype == "float16":
        check_float16(model_type(cfg), f"model.dtype=float16 for model.name={cfg.name!r}")


def lora_targets(model_type_name: str, module_names: list[str], configured: list[str] | str) -> list[str] | str:
    """The LoRA target modules: ``configured``, except that 'all-linear' on a known encoder-decoder family
    becomes its explicit list (the names among :data:`SEQ2SEQ_LORA_TARGETS` that the model has)."""
    known = SEQ2SEQ_LORA_TARGETS.get(model_type_name)
    if configured != "all-linear" or known is None:
        return configured
    leaves = {name.rsplit(".", 1)[-1] for name in module_names}
    return [name for name in known if name in leaves]
