"""The vLLM engine arguments are planned without vLLM: the LoRA rank comes from the adapter's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config.model import ModelConfig
from rayft.errors import ModelError
from rayft.generation.vllm import adapter_max_rank, vllm_engine_args


def _adapter(tmp_path: Path, **config: object) -> Path:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    return tmp_path


def _args(adapter_rank: int | None) -> dict[str, object]:
    return vllm_engine_args(ModelConfig(name="org/m"), "/models/m", None, adapter_rank=adapter_rank,
                            gpu_memory_utilization=0.8, tensor_parallel_size=1)  # fmt: skip


@pytest.mark.parametrize(("r", "rank_pattern", "expected"), [(32, {}, 32), (4, {}, 8), (24, {}, 32),
                                                             (16, {"q_proj": 48}, 64), (300, {}, 320)])  # fmt: skip
def test_max_lora_rank_is_the_adapters_rank_rounded_up_to_one_vllm_accepts(
    tmp_path: Path, r: int, rank_pattern: dict[str, int], expected: int
) -> None:
    rank = adapter_max_rank(_adapter(tmp_path, r=r, rank_pattern=rank_pattern))
    args = _args(rank)
    assert args["enable_lora"] is True
    assert args["max_lora_rank"] == expected
    assert args["model"] == "/models/m"


def test_without_an_adapter_lora_stays_off() -> None:
    args = _args(None)
    assert args["enable_lora"] is False
    assert "max_lora_rank" not in args


def test_a_rank_vllm_cannot_serve_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"rank 1024; .* at most 512: use the 'hf' backend \(eval.backend=hf"):
        _args(adapter_max_rank(_adapter(tmp_path, r=1024)))


def test_an_adapter_without_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"adapter_config.json"):
        adapter_max_rank(tmp_path)
