"""The quantized embedding and head of ``lora.quantize_embeddings``: close to the weights they store,
gradients for the hidden states only (as through the unquantized matrix), one table for a tied model
and two for an untied one, an NF4 table 0.28x of its bf16 size (4 bits a value and a float32 scale per
64 values), and the chunked loss reading a quantized head as its logits do."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")

from rayft.models.quantized import QuantizedHead, QuantizedTable, quantize_embeddings

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics

# Relative to a row's largest value: NF4 rounds to its nearest of 16 levels, at most half its widest gap
# (between 0.72 and 1.0) off, plus the bf16 rounding of the result; int8 to the nearest 1/127.
TOLERANCE = {"nf4": 0.16, "int8": 0.01}


def is_tied(model: Any) -> bool:
    """Whether ``model``'s head reads its input embedding's table (as loaded, or as quantized)."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if isinstance(head, QuantizedHead):
        return head.table is embedding
    return bool(head.weight is embedding.weight)


def tiny_llama(*, tied: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16)


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_a_table_reads_back_close_to_its_weights_in_their_dtype(kind: str) -> None:
    weight = torch.randn(256, 64, dtype=torch.bfloat16)
    table = QuantizedTable(weight, kind)  # type: ignore[arg-type]
    restored = table.dequantized()
    assert restored.dtype == torch.bfloat16 and restored.shape == weight.shape
    scale = weight.abs().amax(dim=1, keepdim=True).float()
    assert ((restored.float() - weight.float()).abs() / scale).max() < TOLERANCE[kind]
    ids = torch.tensor([[0, 5, 255], [7, 7, 1]])
    assert torch.equal(table(ids), restored[ids])  # a lookup reads the same rows


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_the_head_has_the_gradient_of_its_dequantized_matrix(kind: str) -> None:
    table = QuantizedTable(torch.randn(256, 64), kind)  # type: ignore[arg-type]
    hidden = torch.randn(3, 64, requires_grad=True)
    QuantizedHead(table, None)(hidden).square().sum().backward()
    want = hidden.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(want, table.dequantized()).square().sum().backward()
    assert hidden.grad is not None and want.grad is not None
    torch.testing.assert_close(hidden.grad, want.grad)
    assert not any(p.requires_grad for p in [*table.parameters(), *table.buffers()])


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_model_keeps_one_table_and_an_untied_one_two(tied: bool) -> None:
    model = tiny_llama(tied=tied)
    before = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert quantize_embeddings(model, "nf4") == ["model.embed_tokens", "lm_head"]
    assert isinstance(model.get_output_embeddings(), QuantizedHead) and is_tied(model) is tied
    after = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tables = 1 if tied else 2
    # Each 256 x 64 bf16 table (32 KiB) becomes 8 KiB of NF4 and 1 KiB of float32 block scales.
    assert before - after == tables * (256 * 64 * 2 - 256 * 64 // 2 - 256 * 4)
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 256) and logits.dtype == torch.bfloat16


def test_the_chunked_loss_reads_a_quantized_head_as_the_logits_do() -> None:
    from rayft.training.modeling.loss import fused_head

    model = tiny_llama(tied=True).float()
    quantize_embeddings(model, "nf4")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    logits = model(input_ids=ids).logits[0, :-1]
    want = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
    with fused_head(model, ids[:, 1:].reshape(-1), "chunked", shifted=True):
        got = model(input_ids=ids).logits
    # float32 both ways, the chunked loss over the quantized head against the plain cross-entropy of the
    # logits: the same products in other shapes, a loss sum of 4 terms of ~5.5: within ~1e-6 of each other.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
