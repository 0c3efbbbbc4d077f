"""A mixed step: the running rows' next tokens and the joining rows' prompts in one forward.

A mixed step puts every new token of the step in the batch dimension (``[tokens, 1]``: the running
rows' next tokens, then each joining prompt's tokens at their own positions), so the linear layers,
which hold most of a small model's time and all of its weight reads, run once over all of them, and
PEFT's ``adapter_names`` still picks each token's adapter. Attention is the one part that mixes rows:
:func:`_mixed_attention`, registered with transformers' ``AttentionInterface`` and chosen for that
forward only (:func:`mixed_attention_on`), appends the running rows' new keys and values to their cache
in place and attends them over it, and attends each prompt causally over its own tokens (after its cached
prefix, where it has one). :class:`~rayft.serving.batch.RunningBatch` lays the step out and joins its rows.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rayft.serving.prefix_cache import Prefix

MIXED_ATTENTION = "rayft_mixed"
"""The name :func:`_mixed_attention` is registered under in transformers' ``AttentionInterface``."""

MIXED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "phi", "phi3", "granite",
    "olmo2", "cohere", "starcoder2", "glm", "glm4", "helium", "smollm3", "gpt2", "gpt_neox", "gptj",
})  # fmt: skip
"""Model types whose attention layers hand their keys and values, after rotary embeddings, to the attention
interface with their ``layer_idx`` and pass the forward's extra arguments on, as a mixed step needs; each is
checked by a unit test (a mixed step against prefill and decoding steps, on a tiny model of the type). Not
here: a type whose attention does not (StableLM), one not checked yet (Falcon, OLMo), or one whose layers
soft-cap or slide (Gemma 2 and 3)."""


@dataclass
class MixedStep:
    """One mixed step's layout, read by :func:`_mixed_attention` in every attention layer.

    The step's tokens lie in the batch dimension: the ``running`` rows' next tokens first, then each
    joining row's prompt after its cached prefix (``prefixes``, None where it has none), ``(start, length)``
    in ``segments``. ``layers`` are the running rows' cache layers, ``mask`` their positions' mask with the
    new one (``[rows, 1, 1, positions]``, bool); ``joined`` collects each layer's keys and values of the
    joining rows' whole prompts.
    """

    running: int
    segments: list[tuple[int, int]]
    layers: list[Any]
    mask: torch.Tensor
    prefixes: list[Prefix | None]
    joined: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)


def mixes(model: Any) -> bool:
    """Whether ``model`` (a PEFT model or not) can run mixed steps: a model type of :data:`MIXED_MODEL_TYPES`
    with sdpa or eager attention and no sliding window."""
    config = base_model(model).config
    window = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    # Layer kinds other than full attention (sliding, linear, chunked) keep caches the mixed step does not write.
    other_layers = any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ())
    attention = config._attn_implementation
    return config.model_type in MIXED_MODEL_TYPES and attention in ("sdpa", "eager") and not window and not other_layers


def _mixed_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                     *, scaling: float | None = None, rayft_mixed: MixedStep, **kwargs: Any,
                     ) -> tuple[torch.Tensor, None]:  # fmt: skip
    """One attention layer of a mixed step (:class:`MixedStep`), in the ``[tokens, heads, 1, dim]`` layout the
    layer hands over; the result is ``[tokens, 1, heads, dim]``, as transformers' attention functions return."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    plan, outputs = rayft_mixed, []
    running = plan.running
    if running:
        keys, values = plan.layers[module.layer_idx].update(key[:running], value[:running])
        out = sdpa(query[:running], keys, values, attn_mask=plan.mask, scale=scaling, enable_gqa=True)
        outputs.append(out.transpose(1, 2))
    joined = []
    for (start, length), prefix in zip(plan.segments, plan.prefixes, strict=True):
        # [length, heads, 1, dim] -> [1, heads, length, dim]: one prompt as one sequence.
        q, k, v = (t[start : start + length].transpose(0, 2) for t in (query, key, value))
        if prefix is None:
            joined.append((k.contiguous(), v.contiguous()))
            out = sdpa(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        else:  # the prompt's rest attends over its cached prefix and causally over itself
            cached_k, cached_v = prefix.layer(module.layer_idx)
            k, v = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
            joined.append((k, v))
            seen = torch.arange(prefix.tokens + length, device=q.device)
            out = sdpa(q, k, v, attn_mask=seen[None, :] <= seen[prefix.tokens :, None], scale=scaling, enable_gqa=True)
        outputs.append(out.transpose(0, 2).transpose(1, 2))
    plan.joined.append(joined)
    return torch.cat(outputs, dim=0), None


@functools.cache
def _register_mixed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(MIXED_ATTENTION, _mixed_attention)


@contextlib.contextmanager
def mixed_attention_on(model: Any) -> Iterator[None]:
    """The model's attention layers call :func:`_mixed_attention` inside the block (its replica's steps run
    one at a time, under the engine's lock)."""
    _register_mixed_attention()
    config = base_model(model).config
    before = config._attn_implementation_internal
    config._attn_implementation_internal = MIXED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation_internal = before


@contextlib.contextmanager
def last_positions_only(model: Any, rows: list[int]) -> Iterator[bool]:
    """Within the block, the model's final norm hands on only the step's ``rows`` (each row's last token),
    so that the output layer computes the logits of those alone, not of every prompt token (yields
    whether it does: not where the output layer has a LoRA adapter, whose ``adapter_names`` are per token)."""
    base = base_model(model)
    norm = getattr(base.get_decoder(), "norm", None)
    if norm is None or hasattr(base.get_output_embeddings(), "lora_A"):
        yield False
        return
    index = torch.tensor(rows, device=next(norm.parameters()).device)
    handle = norm.register_forward_hook(lambda _module, _args, output: output.index_select(0, index))
    try:
        yield True
    finally:
        handle.remove()


def base_model(model: Any) -> Any:
    """The transformers model itself, under a PEFT model or not."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
