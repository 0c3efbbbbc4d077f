"""LoRA's input dropout without a copy of each adapted layer's input: the same numbers as PEFT's own path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rayft.config.model import LoraConfig, ModelConfig


def _peft_model(tiny_model_dir: Path, dropout: float, **peft_options: Any) -> Any:
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    # init_lora_weights=False: lora_B random too, so that every adapter's gradients are non-zero.
    options = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False} | peft_options
    model = get_peft_model(net, PeftLoraConfig(lora_dropout=dropout, task_type="CAUSAL_LM", **options))
    model.train()
    return model


def _step(model: Any, ids: Any, seed: int = 7) -> tuple[Any, dict[str, Any], int]:
    """(loss, gradients by name, bytes of the distinct storages autograd saved for the backward pass)."""
    import torch

    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, sum(storages.values())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_lean_dropout_gives_peft_s_loss_and_gradients_bit_for_bit_and_keeps_less(
    tiny_model_dir: Path, checkpointing: bool
) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import DroppedInputLinear, lean_lora_dropout
    from rayft.training.modeling.model import enable_activation_checkpointing

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    adapted = sum(1 for m in peft_path.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A"))
    assert lean_lora_dropout(lean) == adapted > 0
    assert sum(isinstance(m, DroppedInputLinear) for m in lean.modules()) == adapted
    assert lean.state_dict().keys() == peft_path.state_dict().keys()
    if checkpointing:
        for model in (peft_path, lean):
            enable_activation_checkpointing(model)
    ids = torch.randint(0, peft_path.config.vocab_size, (3, 24))

    for seed in (7, 8):  # two steps: each draws new masks, the same ones on both paths
        want_loss, want_grads, want_saved = _step(peft_path, ids, seed)
        loss, grads, saved = _step(lean, ids, seed)
        assert torch.equal(loss, want_loss)
        assert grads.keys() == want_grads.keys()
        for name, grad in grads.items():
            assert torch.equal(grad, want_grads[name]), name
            assert grad.abs().sum() > 0, name
        if not checkpointing:
            # PEFT keeps each adapted layer's dropped-out input (float32) and its mask; the lean path the mask only.
            assert saved < want_saved
    # A different seed draws different masks: the dropout is live, not switched off.
    assert not torch.equal(_step(lean, ids, 9)[0], _step(lean, ids, 7)[0])


def test_in_evaluation_the_lean_layer_is_lora_a_without_dropout(tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    lean_lora_dropout(lean)
    ids = torch.randint(0, peft_path.config.vocab_size, (2, 16))
    peft_path.eval()
    lean.eval()
    with torch.no_grad():
        assert torch.equal(lean(input_ids=ids).logits, peft_path(input_ids=ids).logits)
        assert torch.equal(lean(input_ids=ids).logits, lean(input_ids=ids).logits)


def test_the_saved_adapter_is_peft_s_and_loads_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json

    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    peft_path = _peft_model(tiny_model_dir, 0.3)
    lean = copy.deepcopy(peft_path)
    lean_lora_dropout(lean)
    peft_path.save_pretrained(tmp_path / "peft")
    lean.save_pretrained(tmp_path / "lean")
    want = load_file(tmp_path / "peft/adapter_model.safetensors")
    got = load_file(tmp_path / "lean/adapter_model.safetensors")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((tmp_path / "lean/adapter_config.json").read_text())["lora_dropout"] == 0.3
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "lean"))
    ids = torch.randint(0, peft_path.config.vocab_size, (2, 16))
    peft_path.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, peft_path(input_ids=ids).logits)


@pytest.mark.parametrize(("dropout", "options"), [(0.0, {}), (0.3, {"use_dora": True})])
def test_adapters_without_dropout_or_with_a_variant_keep_peft_s_path(
    tiny_model_dir: Path, dropout: float, options: dict[str, Any]
) -> None:
    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    model = _peft_model(tiny_model_dir, dropout, **options)
    assert lean_lora_dropout(model) == 0


def test_the_worker_s_build_takes_the_lean_dropout(tiny_model_dir: Path) -> None:
    from rayft.training.modeling.lora_dropout import DroppedInputLinear
    from rayft.training.modeling.model import build_training_model

    def build(dropout: float) -> Any:
        return build_training_model(
            ModelConfig(name=str(tiny_model_dir)), LoraConfig(dropout=dropout), "lora", "cpu",
            gradient_checkpointing=False, restore_dir=None,
        )  # fmt: skip

    assert any(isinstance(m, DroppedInputLinear) for m in build(0.05).modules())
    assert not any(isinstance(m, DroppedInputLinear) for m in build(0.0).modules())
