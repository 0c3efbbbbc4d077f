"""The chunked loss equals the plain one (loss and gradients; LoRA and full; kept logits, every
position, packed rows), and which loss train.fused_loss picks where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import build_units, make_unit
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError, MissingDependencyError

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics


def _examples(vocab: int, lengths: tuple[int, ...] = (9, 14, 6, 11, 5)) -> list[dict[str, Any]]:
    import random

    rng = random.Random(3)
    out = []
    for sample_id, length in enumerate(lengths):
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        prompt = rng.randint(1, length - 2)
        out.append({**make_unit(ids, [IGNORE_INDEX] * prompt + ids[prompt:], list(range(length)), [sample_id]),
                    "sample_id": sample_id})  # fmt: skip
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_head_loss_and_gradients_equal_plain_cross_entropy(monkeypatch: pytest.MonkeyPatch, bias: bool) -> None:
    import torch
    from torch.nn.functional import cross_entropy, linear

    from rayft.training.modeling import loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_BYTES", 4 * 50 * 16)  # 16 positions per chunk: 5 chunks
    torch.manual_seed(0)
    hidden = torch.randn(2, 40, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, requires_grad=True) if bias else None
    targets = torch.randint(0, 50, (2, 40))
    targets[0, :7] = IGNORE_INDEX
    targets[1, 30:] = IGNORE_INDEX
    inputs = [t for t in (hidden, weight, b) if t is not None]

    chunked = loss_module.head_loss(hidden, weight, b, targets, "chunked")
    chunked_grads = torch.autograd.grad(chunked * 0.5, inputs)
    plain = cross_entropy(linear(hidden, weight, b).reshape(-1, 50), targets.reshape(-1), reduction="sum")
    plain_grads = torch.autograd.grad(plain * 0.5, inputs)
    # The plain loss runs in float64 throughout: the reference. The chunked loss rounds its logits to float32
    # (each within u = 2**-24 of itself; |logit| < 12 here) and takes log-softmax over 50 entries in float32:
    # each position's term is within ~16u * (|logit| + log 50) of exact, ~3e-6 against a term of ~5; the 66
    # terms' errors add up to at most 66 times that against a sum of ~66 * 5: 1e-6 relative at worst. A
    # gradient entry sums up to 80 positions' float32 softmax (each within a few u) times float64 values;
    # those independent roundings add as sqrt(80) * 8u = 4e-6 of the terms' magnitudes (1e-5 of the entry,
    # 1e-6 absolute where its terms cancel), on any kernel: the error is the float32 rounding, not the order.
    assert float(chunked.detach()) == pytest.approx(float(plain.detach()), rel=1e-6)
    for a, e in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-6)


def _loss_and_grads(model: Any, batches: list[Any], **options: Any) -> tuple[float, list[Any]]:

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    model.zero_grad()
    total = sum(b.num_label_tokens for b in batches)
    loss = sum(token_loss_sum(model, b, Precision(None, False), **options) for b in batches) / total
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def _model(tiny_model_dir: Path, method: str, attn: str = "sdpa") -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    elif method == "lora+head":  # the head trained in full beside the adapter (PEFT's modules_to_save)
        model = get_peft_model(
            model, LoraConfig(r=4, target_modules="all-linear", modules_to_save=["lm_head"], task_type="CAUSAL_LM")
        )
    return model


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")  # the tiny model ties them
@pytest.mark.parametrize("method", ["full", "lora", "lora+head"])
@pytest.mark.parametrize("keep_logits", [True, False])
def test_chunked_loss_equals_plain_on_packed_rows(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, method: str, keep_logits: bool
) -> None:
    import torch

    from rayft.training.loop import steps
    from rayft.training.modeling import loss as loss_module

    if not keep_logits:  # as for a model whose forward has no logits_to_keep: the head sees every position
        monkeypatch.setattr(steps, "_takes_logits_to_keep", lambda model: False)
    monkeypatch.setattr(loss_module, "CHUNK_BYTES", 4 * 600 * 16)  # several chunks per batch
    model = _model(tiny_model_dir, method)
    examples = _examples(model.config.vocab_size)
    batches = [collate(build_units(examples, [[0, 1], [2, 3, 4]]), pad_token_id=0, pad_to_multiple_of=8)]
    plain_loss, plain_grads = _loss_and_grads(model, batches, loss="none")
    chunked_loss, chunked_grads = _loss_and_grads(model, batches, loss="chunked")
    assert chunked_loss == pytest.approx(plain_loss, rel=1e-6)
    assert len(chunked_grads) == len(plain_grads) and chunked_grads
    for a, e in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_chunked_loss_without_gradients_and_without_labels(tiny_model_dir: Path) -> None:
    import torch

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    model = _model(tiny_model_dir, "full")
    batch = collate(_examples(model.config.vocab_size)[:2], pad_token_id=0)
    with torch.no_grad():
        chunked = token_loss_sum(model, batch, Precision(None, False), loss="chunked")
        plain = token_loss_sum(model, batch, Precision(None, False))
    assert float(chunked) == pytest.approx(float(plain), rel=1e-6)
    unlabelled = collate([make_unit([5, 6, 7], [IGNORE_INDEX] * 3, [0, 1, 2], [0])], pad_token_id=0)
    loss = token_loss_sum(model, unlabelled, Precision(None, False), loss="chunked")
    assert float(loss.detach()) == 0.0
    loss.backward()


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_a_lora_adapter_on_the_head_is_refused_with_the_fix(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    model = get_peft_model(_model(tiny_model_dir, "full"), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    batch = collate(_examples(model.config.vocab_size)[:1], pad_token_id=0)
    with pytest.raises(ConfigError, match="set train.fused_loss=none or leave lm_head out"):
        token_loss_sum(model, batch, Precision(None, False), loss="chunked")
    assert "forward" not in vars(model.get_base_model().lm_head)  # nothing left patched


def test_fused_loss_setting_resolves_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.training.modeling import loss as loss_module

    monkeypatch.setattr(loss_module, "liger_installed", lambda: False)
    assert loss_module.resolve_loss("auto", "cpu") == "chunked"
    assert loss_module.resolve_loss("auto", "cuda") == "chunked"
    assert loss_module.resolve_loss("none", "cuda") == "none"
    with pytest.raises(ConfigError, match="use train.fused_loss=chunked"):
        loss_module.resolve_loss("liger", "cpu")
    with pytest.raises(MissingDependencyError, match=r"pip install 'rayft\[liger\]'"):
        loss_module.resolve_loss("liger", "cuda")
    monkeypatch.setattr(loss_module, "liger_installed", lambda: True)
    assert loss_module.resolve_loss("auto", "cuda") == "liger"
    assert loss_module.resolve_loss("auto", "cpu") == "chunked"
