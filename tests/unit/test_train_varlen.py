"""Packed batches carry the bounds variable-length attention kernels take (cu_seq_lens_q/k,
max_length_q/k), and an attention that consumes them computes the loss of the examples run one by
one; model.attn_implementation takes flex_attention and Hub kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.data.collate import collate, sequence_bounds
from rayft.data.packing import build_units

from .test_data_packing import _examples

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics


def test_bounds_of_packed_rows_laid_end_to_end() -> None:
    import torch

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 0, 1, 2]])
    cu_seq_lens, max_length = sequence_bounds(positions)
    assert cu_seq_lens.dtype == torch.int32
    assert cu_seq_lens.tolist() == [0, 3, 5, 8, 13, 16]
    assert max_length == 8  # the longest example (5) rounded up to a power of two, capped at the row width
    assert sequence_bounds(torch.arange(100)[None])[1] == 100
    assert sequence_bounds(torch.tensor([[0, 1, 2, 0, 0, 1]]))[0].tolist() == [0, 3, 4, 6]


def test_collated_batches_pass_the_bounds_as_transformers_expects() -> None:
    units = build_units([{**e, "sample_id": e["sample_ids"][0]} for e in _examples(50)], [[0, 1, 2], [3, 4, 5]])
    batch = collate(units, pad_token_id=0, pad_to_multiple_of=16)  # rows of 27 and 22 tokens, padded to 32
    kwargs = batch.varlen_kwargs()
    assert kwargs["cu_seq_lens_q"] is kwargs["cu_seq_lens_k"]
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 9, 14, 27, 32, 36, 43, 54, 64]
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 16
    moved = batch.to("cpu")
    assert moved.varlen_kwargs()["cu_seq_lens_q"].tolist() == kwargs["cu_seq_lens_q"].tolist()


def _loss(model: Any, batches: list[Any], varlen: bool) -> float:
    import torch

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    total = sum(b.num_label_tokens for b in batches)
    with torch.no_grad():
        return sum(float(token_loss_sum(model, b, Precision(None, False), varlen=varlen)) for b in batches) / total


def _packed_and_single(vocab: int) -> tuple[Any, list[Any]]:
    examples = _examples(vocab)
    units = build_units([{**e, "sample_id": e["sample_ids"][0]} for e in examples], [[0, 1, 2], [3, 4, 5]])
    return collate(units, pad_token_id=0, pad_to_multiple_of=8), [collate([e], pad_token_id=0) for e in examples]


def test_per_example_attention_reads_the_bounds_it_is_given(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling import attention

    attention.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention.PER_EXAMPLE_SDPA)
    packed, single = _packed_and_single(model.config.vocab_size)
    assert _loss(model, [packed], varlen=True) == pytest.approx(_loss(model, single, varlen=False), abs=1e-5)
    # The check can fail: bounds that merge two examples let attention cross them.
    packed.varlen_kwargs()
    packed.cu_seq_lens = torch.tensor([0, 14, 27, 32, 36, 43, 54, 64], dtype=torch.int32)
    assert abs(_loss(model, [packed], varlen=True) - _loss(model, single, varlen=False)) > 1e-3
    packed.cu_seq_lens = torch.tensor([0, 9, 14, 34, 64], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="puts an example across rows 0 and 1"):
        _loss(model, [packed], varlen=True)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_mask_based_attention_ignores_the_bounds_and_stays_exact(tiny_model_dir: Path, attn: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn)
    packed, single = _packed_and_single(model.config.vocab_size)
    assert _loss(model, [packed], varlen=True) == pytest.approx(_loss(model, single, varlen=False), abs=1e-5)


@pytest.mark.slow  # flex_attention compiles its kernel on CPU (~40 s) and has no CPU backward
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's and transformers' own, while they compile
def test_flex_attention_packed_loss_equals_one_by_one(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="flex_attention")
    packed, single = _packed_and_single(model.config.vocab_size)
    assert _loss(model, [packed], varlen=True) == pytest.approx(_loss(model, single, varlen=False), abs=1e-5)


def test_attention_setting_takes_flex_and_hub_kernels_and_names_the_choices() -> None:
    from rayft.config.model import ModelConfig
    from rayft.training.modeling.attention import PER_EXAMPLE_SDPA, uses_varlen

    kinds = ("flex_attention", "flash_attention_3", "kernels-community/flash-attn", "org/kernel@v1:fn")
    for name in kinds:
        assert ModelConfig(attn_implementation=name).attn_implementation == name
    with pytest.raises(
        ValueError, match=r"'flash2' is neither one of auto, sdpa, eager, flex_attention.*Hub kernel repo"
    ):
        ModelConfig(attn_implementation="flash2")
    assert uses_varlen("flash_attention_2") and uses_varlen("kernels-community/flash-attn")
    assert uses_varlen(PER_EXAMPLE_SDPA)
    assert not uses_varlen("sdpa") and not uses_varlen("flex_attention") and not uses_varlen("eager")


@pytest.mark.parametrize(("attn", "width"), [("flex_attention", 128), ("sdpa", 37), ("eager", 37)])
def test_training_rows_are_whole_flex_blocks_and_as_long_as_needed_otherwise(attn: str, width: int) -> None:
    """flex_attention lowers rows shorter than a block to a decoding kernel that cannot train on
    CUDA; training pads its rows to whole blocks for it (labels -100) and leaves other kernels alone."""
    from types import SimpleNamespace

    from rayft.data.prepared import IGNORE_INDEX
    from rayft.training.loop.objective import CausalLm

    plan = SimpleNamespace(model=SimpleNamespace(attn_implementation=attn), train=SimpleNamespace(padding_free=False))
    objective = CausalLm(plan, SimpleNamespace(pad_token_id=0), None)  # type: ignore[arg-type]
    unit = {"input_ids": list(range(1, 38)), "labels": list(range(1, 38)), "position_ids": list(range(37)),
            "sample_ids": [0], "num_tokens": 37, "num_label_tokens": 37}  # fmt: skip
    batch = objective.collate([unit])
    assert tuple(batch.input_ids.shape) == (1, width)
    assert batch.labels[0, 37:].eq(IGNORE_INDEX).all() and batch.num_label_tokens == 37


@pytest.mark.parametrize("units", [[[0], [1], [2], [3], [4], [5]], [[0, 1, 2], [3, 4, 5]]], ids=["unpacked", "packed"])
def test_a_padding_free_micro_batch_trains_as_the_padded_one(tiny_model_dir: Path, units: list[list[int]]) -> None:
    """train.padding_free: the units laid end to end in one row give the padded micro-batch's loss and
    gradients with per-example SDPA, over fewer positions."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.data.collate import end_to_end
    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling import attention
    from rayft.training.modeling.precision import Precision

    attention.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention.PER_EXAMPLE_SDPA)
    built = build_units([{**e, "sample_id": e["sample_ids"][0]} for e in _examples(model.config.vocab_size)], units)
    padded, free = collate(built, pad_token_id=0), collate([end_to_end(built)], pad_token_id=0)
    assert free.input_ids.shape[0] == 1 and free.num_computed_tokens == free.num_tokens < padded.num_computed_tokens
    assert (free.num_tokens, free.num_label_tokens, free.sample_ids) == (
        padded.num_tokens, padded.num_label_tokens, padded.sample_ids,
    )  # fmt: skip
    results = []
    for batch in (padded, free):
        model.zero_grad(set_to_none=True)
        loss = token_loss_sum(model, batch, Precision(None, False), loss="chunked", varlen=True)
        loss.backward()
        results.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
    # float32 both ways, the same per-example sums in products of other shapes (padded rows vs one row):
    # ~1e-7 relative on the loss, as in test_data_packing; a gradient entry sums its terms over ~64 positions in
    # whatever order the kernel picks: rtol 1e-4 is ~1,700 roundings, atol 1e-6 for entries that cancel.
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    for a, b in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
