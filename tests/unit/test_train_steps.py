"""The training loss: logits only where a label is trained, and the same loss and gradients as over
every position (plain and LoRA models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import make_unit
from rayft.data.prepared import IGNORE_INDEX

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics


def _units(vocab: int) -> list[dict[str, Any]]:
    import random

    rng = random.Random(1)
    units = []
    for sample_id, length in enumerate([9, 14, 6]):
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        prompt = rng.randint(2, length - 2)
        units.append(make_unit(ids, [IGNORE_INDEX] * prompt + ids[prompt:], list(range(length)), [sample_id]))
    return units


def _full_logits_loss(model: Any, batch: Any) -> Any:
    from torch.nn.functional import cross_entropy

    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits
    shifted = logits[:, :-1].float()
    return cross_entropy(shifted.reshape(-1, shifted.size(-1)), batch.labels[:, 1:].reshape(-1),
                         ignore_index=IGNORE_INDEX, reduction="sum")  # fmt: skip


@pytest.mark.parametrize("lora", [False, True])
def test_loss_over_kept_logits_equals_loss_over_every_position(tiny_model_dir: Path, lora: bool) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rayft.training.loop.steps import _takes_logits_to_keep, token_loss_sum
    from rayft.training.modeling.precision import Precision

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert _takes_logits_to_keep(model)  # otherwise the check below compares the same computation
    batch = collate(_units(model.config.vocab_size), pad_token_id=0)
    trained = [p for p in model.parameters() if p.requires_grad]

    kept = token_loss_sum(model, batch, Precision(None, False))
    kept_grads = torch.autograd.grad(kept, trained)
    full = _full_logits_loss(model, batch)
    full_grads = torch.autograd.grad(full, trained)
    # The same float32 operations, the head's product taken over the kept positions or over every one: a
    # product of another shape may be blocked (summed) in another order by the kernel, moving each logit by
    # about sqrt(64) * 2**-24 of its terms (64: the hidden width); the loss, a sum of ~ln(vocab) terms whose
    # errors are independent, by ~1e-7 relative. rel=1e-6 (16 roundings) holds it on any kernel path.
    assert float(kept.detach()) == pytest.approx(float(full.detach()), rel=1e-6)
    for a, b in zip(kept_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_batch_without_labels_has_zero_loss(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    unit = make_unit([5, 6, 7, 8], [IGNORE_INDEX] * 4, [0, 1, 2, 3], [0])
    loss = token_loss_sum(model, collate([unit], pad_token_id=0), Precision(None, False))
    assert float(loss.detach()) == 0.0
    loss.backward()
