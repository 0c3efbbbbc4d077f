"""Which KV cache HF generation uses, and the static cache's shapes (pure: no torch).

A dynamic cache grows by one position per generated token. A static cache is allocated once per
``generate`` call for the prompt and every new token, so its shapes never change while decoding and
``torch.compile`` can capture the decoding step (on CUDA with CUDA graphs). The compiled step is
specialised on the cache's length and the batch's size, so both are kept to a few values: the
length is rounded up to a bucket (:func:`cache_length`) and a compiled backend fills a short batch
up to its batch size (:func:`filled_batch`). The prompts themselves are not padded further: the
prefill runs eagerly, and each prompt keeps the tokens (and positions) it has with a dynamic cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from rayft.config.generation import CompileSetting, KVCacheSetting
from rayft.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class CachePlan:
    """How one backend decodes: with a static cache or not, and with a compiled decoding step or not."""

    static: bool
    compile: bool


def plan_cache(
    kv_cache: KVCacheSetting,
    compile: CompileSetting,
    device_type: str,
    *,
    encoder_decoder: bool,
    compilable: bool = True,
) -> CachePlan:
    """The cache and compilation for a backend on ``device_type`` ('cuda', 'cpu', ...).

    'auto' picks the measured fast path: on CUDA a static cache with a compiled decoding step, for
    a model that declares it compiles as one graph (``compilable``: transformers'
    ``_can_compile_fullgraph``); otherwise a dynamic cache, uncompiled (on CPU neither was faster:
    docs/performance.md), unless ``compile`` is true, which needs a static cache. Encoder-decoder
    models keep the dynamic cache.

    Raises:
        ConfigError: ``compile`` true with a dynamic cache, or a static cache or compilation asked
            of an encoder-decoder model.
    """
    if kv_cache == "dynamic" and compile is True:
        raise ConfigError(
            "generation.compile true needs generation.kv_cache 'static' (or 'auto'): a dynamic cache changes "
            "shape at every token, so the compiled step would recompile; set kv_cache: static or compile: false"
        )
    if encoder_decoder and (kv_cache == "static" or compile is True):
        raise ConfigError(
            f"generation.kv_cache {kv_cache!r} with compile {compile!r} is for decoder-only models, and this "
            "model is an encoder-decoder; set generation.kv_cache: auto and generation.compile: auto"
        )
    fast_path = device_type == "cuda" and not encoder_decoder and compilable
    static = kv_cache == "static" or (kv_cache == "auto" and (fast_path or compile is True))
    compiled = static and (compile is True or (compile == "auto" and fast_path))
    return CachePlan(static=static, compile=compiled)


def bucket(length: int, minimum: int = 64) -> int:
    """``length`` rounded up to the next of a few sizes: ``minimum``, or 4, 5, 6 or 7 times a power
    of two (64, 80, 96, 112, 128, 160, ...): at most 25% more, and four sizes per doubling."""
    if length <= minimum:
        return minimum
    power = 1 << max(0, length.bit_length() - 3)  # length lies in [4, 8) x power
    return -(-length // power) * power


def cache_length(longest_prompt: int, max_new_tokens: int) -> int:
    """Positions of a static cache for a batch: its longest prompt and every new token, bucketed."""
    return bucket(longest_prompt + max_new_tokens)


def filled_batch(items: Sequence[T], batch_size: int) -> list[T]:
    """``items`` with the last one repeated up to ``batch_size`` (the extra results are dropped), so
    that a compiled step sees one batch size; a longer ``items`` is returned as it is."""
    return [*items, *[items[-1]] * (batch_size - len(items))] if items else []
