"""The GPU tier: LoRA's lean input dropout on the tier's device against PEFT's own path.

On CUDA, PEFT's ``nn.Dropout`` runs the same fused dropout kernel as the lean path, so both draw the same
masks from the same generator; the losses and gradients are compared, and the bytes kept for the backward,
in float32 and under bf16 autocast (the default for LoRA on a GPU, where the backward pass must run in the
forward's dtypes).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.unit.test_lora_dropout import _peft_model, _step

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_lean_dropout_gives_peft_s_loss_and_gradients_on_the_device(
    tiny_model_dir: Path, device: str, autocast: bool
) -> None:
    import torch

    from rayft.training.modeling.lora_dropout import lean_lora_dropout

    peft_path = _peft_model(tiny_model_dir, 0.3).to(device)
    lean = copy.deepcopy(peft_path)
    assert lean_lora_dropout(lean) > 0
    ids = torch.randint(0, peft_path.config.vocab_size, (3, 24), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        want_loss, want_grads, want_saved = _step(peft_path, ids)
        loss, grads, saved = _step(lean, ids)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    # Under autocast both keep the dropped-out input in bf16; in float32 the lean path keeps the mask only.
    assert saved <= want_saved if autocast else saved < want_saved
