"""The HF backend's KV cache: the plan for each device, the static cache's few shapes, and the same
greedy completions with a dynamic cache, a static one, and a static one with a compiled step."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rayft.config.generation import GenerationConfig
from rayft.config.inference import InferenceConfig
from rayft.errors import ConfigError
from rayft.generation.kv_cache import CachePlan, bucket, cache_length, filled_batch, plan_cache


@pytest.mark.parametrize(
    ("kv_cache", "compile", "device", "expected"),
    [
        ("auto", "auto", "cuda", CachePlan(static=True, compile=True)),
        ("auto", "auto", "cpu", CachePlan(static=False, compile=False)),
        ("auto", True, "cpu", CachePlan(static=True, compile=True)),
        ("auto", False, "cuda", CachePlan(static=True, compile=False)),
        ("static", "auto", "cpu", CachePlan(static=True, compile=False)),
        ("dynamic", "auto", "cuda", CachePlan(static=False, compile=False)),
    ],
)
def test_plan_takes_the_fast_path_of_each_device(
    kv_cache: str, compile: object, device: str, expected: CachePlan
) -> None:
    assert plan_cache(kv_cache, compile, device, encoder_decoder=False) == expected  # type: ignore[arg-type]


def test_plan_refuses_what_cannot_work_and_keeps_other_models_dynamic() -> None:
    assert plan_cache("auto", "auto", "cuda", encoder_decoder=True) == CachePlan(static=False, compile=False)
    uncompilable = plan_cache("auto", "auto", "cuda", encoder_decoder=False, compilable=False)
    assert uncompilable == CachePlan(static=False, compile=False)
    assert plan_cache("static", "auto", "cuda", encoder_decoder=False, compilable=False).compile is False
    with pytest.raises(ConfigError, match="compile true needs generation.kv_cache 'static'"):
        plan_cache("dynamic", True, "cuda", encoder_decoder=False)
    with pytest.raises(ConfigError, match="'static' with compile 'auto' is for decoder-only models"):
        plan_cache("static", "auto", "cuda", encoder_decoder=True)
    with pytest.raises(ValidationError, match="compile true needs kv_cache 'static'"):
        GenerationConfig(kv_cache="dynamic", compile=True)
    with pytest.raises(ValidationError, match="compile true needs kv_cache 'static'"):
        InferenceConfig(kv_cache="dynamic", compile=True)


def test_settings_reach_the_generation_section_of_eval_sdg_and_rayft_generate() -> None:
    from rayft.config import load_config
    from rayft.inference.batch import generation_config

    overrides = ["eval.generation.kv_cache=static", "sdg.teacher.compile=false", "inference.backend=openai",
                 "inference.kv_cache=static", "inference.compile=true"]  # fmt: skip
    cfg = load_config(None, overrides)
    assert (cfg.eval.generation.kv_cache, cfg.eval.generation.compile) == ("static", "auto")
    assert (cfg.sdg.teacher.kv_cache, cfg.sdg.teacher.compile) == ("auto", False)
    gen_cfg, _ = generation_config(cfg, "some-model")
    assert (gen_cfg.kv_cache, gen_cfg.compile) == ("static", True)


def test_static_cache_lengths_come_in_a_few_sizes() -> None:
    assert [bucket(n) for n in (1, 64, 65, 80, 81, 127, 128, 129, 237, 1000)] == [
        64, 64, 80, 80, 96, 128, 128, 160, 256, 1024,
    ]  # fmt: skip
    assert {cache_length(prompt, 160) for prompt in range(40, 200)} == {224, 256, 320, 384}
    assert all(cache_length(prompt, 160) >= prompt + 160 for prompt in range(1, 3000))
    assert filled_batch(["a", "b"], 4) == ["a", "b", "b", "b"]
    assert filled_batch(["a", "b", "c"], 2) == ["a", "b", "c"]
    assert filled_batch([], 4) == []


def _completions(model_dir: Path, **options: object) -> list[tuple[str, int, str]]:
    from rayft.config.model import ModelConfig
    from rayft.generation.hf import HFBackend
    from tests.support.generation import greedy_completions

    backend = HFBackend(ModelConfig(name=str(model_dir)), device="cpu", batch_size=2, **options)  # type: ignore[arg-type]
    return greedy_completions(backend)


def test_static_cache_generates_what_the_dynamic_one_does(tiny_model_dir: Path) -> None:
    dynamic = _completions(tiny_model_dir)
    assert _completions(tiny_model_dir, kv_cache="static", compile=False) == dynamic
    assert len({text for text, _, _ in dynamic}) > 1  # the prompts lead somewhere different


@pytest.mark.slow  # compiling on CPU takes ~10 s
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor on CPU
def test_compiled_static_cache_generates_what_the_dynamic_one_does_compiling_once(tiny_model_dir: Path) -> None:
    import torch._dynamo.utils

    dynamic = _completions(tiny_model_dir)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # Five prompts of different lengths in batches of 2 (the last one filled): one compiled graph.
    assert _completions(tiny_model_dir, kv_cache="static", compile=True) == dynamic
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1
