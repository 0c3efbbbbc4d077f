"""The GPU tier's generation check (run by ``make gpu-check``): on CUDA the HF backend's default
plan decodes with a static KV cache and a compiled step, and its greedy completions equal the
dynamic cache's. No Ray: only torch, transformers and the tiny model's tokenizer.
``RAYFT_GPU_TIER_DEVICE=cpu`` runs it on the CPU with the static cache and compilation asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu


def _backend(model_dir: Path, device: str, **options: Any) -> Any:
    from rayft.config.model import ModelConfig
    from rayft.generation.hf import HFBackend

    # float32: the comparison is of the cache, not of bf16 rounding in two attention lengths.
    return HFBackend(ModelConfig(name=str(model_dir), dtype="float32"), device=device, batch_size=2, **options)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor on CPU
def test_default_plan_compiles_a_static_cache_and_generates_what_the_dynamic_one_does(
    device: str, tiny_model_dir: Path
) -> None:
    import torch._dynamo.utils

    from rayft.generation.kv_cache import CachePlan
    from tests.support.generation import greedy_completions

    dynamic = greedy_completions(_backend(tiny_model_dir, device, kv_cache="dynamic", compile=False))
    options = {"kv_cache": "auto", "compile": "auto"} if device == "cuda" else {"kv_cache": "static", "compile": True}
    fast = _backend(tiny_model_dir, device, **options)
    assert fast.cache == CachePlan(static=True, compile=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert greedy_completions(fast) == dynamic
    assert greedy_completions(fast) == dynamic  # the second pass reuses the compiled step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1
