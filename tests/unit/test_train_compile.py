"""train.compile: every transformer block compiled in place gives the eager losses (tiny model,
a few optimizer steps on CPU; compiling takes most of the test's time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import build_units

from .test_data_packing import _examples


def _losses(model: Any, batch: Any, steps: int) -> list[float]:
    import torch

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = token_loss_sum(model, batch, Precision(None, False), loss="chunked", varlen=True)
        (loss / batch.num_label_tokens).backward()
        optimizer.step()
        losses.append(float(loss.detach()) / batch.num_label_tokens)
    return losses


@pytest.mark.slow  # compiling on CPU takes ~40-70 s
# Warnings torch emits while it traces and compiles (not about rayft's code).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_compiled_blocks_train_as_eager(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling import attention
    from rayft.training.modeling.model import compile_each_block

    attention.register()
    units = build_units([{**e, "sample_id": e["sample_ids"][0]} for e in _examples(400)], [[0, 1, 2], [3, 4, 5]])
    batch = collate(units, pad_token_id=0, pad_to_multiple_of=8)
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention.PER_EXAMPLE_SDPA)
        if compiled:
            assert compile_each_block(model) == model.config.num_hidden_layers
            assert all(hasattr(layer, "_compiled_call_impl") for layer in model.model.layers)
        runs.append(_losses(model, batch, steps=3))
    eager, compiled_losses = runs
    assert eager[2] < eager[0]  # the steps train
    assert compiled_losses == pytest.approx(eager, rel=1e-4)


def test_a_model_that_names_no_blocks_is_refused(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rayft.errors import ModelError
    from rayft.training.modeling.model import compile_each_block

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model._no_split_modules = []
    with pytest.raises(ModelError, match="set train.compile=false"):
        compile_each_block(model)
