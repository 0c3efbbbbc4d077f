"""The adapter checks catch empty, zero, truncated and mis-shaped adapters, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rayft.export.checks import check_adapter  # noqa: E402

MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]


def _write(directory: Path, tensors: dict[str, object], r: int = 4, targets: list[str] | None = None) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))  # type: ignore[arg-type]
    config = {"r": r, "target_modules": targets or ["q_proj", "v_proj"], "base_model_name_or_path": "x"}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def _good(r: int = 4, zero_b: bool = False) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    out: dict[str, object] = {}
    for module in MODULES:
        out[f"base_model.model.{module}.lora_A.weight"] = torch.randn(r, 32, generator=gen)
        b = torch.zeros(32, r) if zero_b else torch.randn(32, r, generator=gen)
        out[f"base_model.model.{module}.lora_B.weight"] = b
    return out


def test_a_good_adapter_passes(tmp_path: Path) -> None:
    problems, summary = check_adapter(_write(tmp_path, _good()), expected_r=4, expected_targets=["q_proj"])
    assert problems == []
    assert summary is not None
    assert summary.r == 4
    assert summary.modules[MODULES[0]] == ((4, 32), (32, 4))
    assert summary.num_parameters == 2 * (4 * 32 + 32 * 4)


def test_all_zero_b_is_an_empty_adapter(tmp_path: Path) -> None:
    problems, _ = check_adapter(_write(tmp_path, _good(zero_b=True)))
    assert len(problems) == 1
    assert "lora_B of 2 of 2 modules is all zero" in problems[0]


def test_rank_mismatch_and_wrong_shapes(tmp_path: Path) -> None:
    tensors = _good()
    tensors[f"base_model.model.{MODULES[1]}.lora_A.weight"] = torch.randn(2, 32)  # one rank's slice
    problems, _ = check_adapter(_write(tmp_path, tensors), expected_r=8)
    assert any("r=4 but the training config has lora.r=8" in p for p in problems)
    assert any(f"{MODULES[1]} has lora_A (2, 32)" in p for p in problems)


def test_missing_targets_and_half_pairs(tmp_path: Path) -> None:
    tensors = _good()
    del tensors[f"base_model.model.{MODULES[1]}.lora_B.weight"]
    problems, _ = check_adapter(
        _write(tmp_path, tensors, targets=["q_proj", "v_proj", "o_proj"]), expected_targets=["k_proj"]
    )
    text = "\n".join(problems)
    assert "v_proj has only lora_A" in text
    assert "no adapter for configured target modules ['o_proj']" in text
    assert "the training config targets ['k_proj']" in text


def test_truncated_and_empty_files(tmp_path: Path) -> None:
    directory = _write(tmp_path / "truncated", _good())
    weights = directory / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    problems, summary = check_adapter(directory)
    assert summary is None
    assert "cannot be read" in problems[0] and "truncated or corrupted" in problems[0]
    problems, _ = check_adapter(_write(tmp_path / "empty", {"other.weight": torch.ones(2)}))
    assert "holds no LoRA tensors" in problems[0]
    assert "NaN" not in problems[0]


def test_nan_values_are_caught(tmp_path: Path) -> None:
    tensors = _good()
    tensors[f"base_model.model.{MODULES[0]}.lora_B.weight"] = torch.full((32, 4), float("nan"))
    problems, _ = check_adapter(_write(tmp_path, tensors))
    assert any("NaN or infinite" in p for p in problems)
