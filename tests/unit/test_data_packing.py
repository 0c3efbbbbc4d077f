"""Sequence packing: the bin-packing planner, and the proof that a packed batch computes the same
loss and gradients as its examples run one by one (fp32, tiny model, sdpa, eager and per-example sdpa attention)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from rayft.data.collate import collate
from rayft.data.packing import build_units, make_unit, plan_packs
from rayft.data.prepared import IGNORE_INDEX

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics


def test_first_fit_decreasing_fills_bins_and_places_every_example_once() -> None:
    assert plan_packs([5, 6, 4, 3, 2], 10) == [[1, 2], [0, 3, 4]]
    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(2000)]
    packs = plan_packs(lengths, 512)
    assert sorted(i for p in packs for i in p) == list(range(2000))
    assert all(sum(lengths[i] for i in p) <= 512 for p in packs)
    lower_bound = -(-sum(lengths) // 512)
    assert len(packs) <= lower_bound * 1.02  # FFD wastes little on mixed lengths
    assert plan_packs(lengths, 512) == packs  # deterministic


def test_examples_longer_than_a_bin_are_refused() -> None:
    with pytest.raises(ValueError, match="example of 11 tokens into sequences of 10"):
        plan_packs([3, 11], 10)


def test_units_restart_positions_and_list_their_samples() -> None:
    examples = [
        {"sample_id": 7, "input_ids": [1, 2, 3], "labels": [IGNORE_INDEX, 2, 3]},
        {"sample_id": 9, "input_ids": [4, 5], "labels": [IGNORE_INDEX, 5]},
    ]
    (unit,) = build_units(examples, [[1, 0]])
    assert unit == {
        "input_ids": [4, 5, 1, 2, 3],
        "labels": [IGNORE_INDEX, 5, IGNORE_INDEX, 2, 3],
        "position_ids": [0, 1, 0, 1, 2],
        "sample_ids": [9, 7],
        "num_tokens": 5,
        "num_label_tokens": 3,
    }


def _examples(vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for sample_id, length in enumerate([9, 5, 13, 4, 7, 11]):
        ids = [rng.randrange(4, vocab) for _ in range(length)]
        prompt = rng.randint(1, length - 2)
        labels = [IGNORE_INDEX] * prompt + ids[prompt:]
        out.append(make_unit(ids, labels, list(range(length)), [sample_id]))
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager", "sdpa_per_example"])
def test_packed_loss_and_gradients_equal_one_by_one(tiny_model_dir: Path, attn: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling import attention
    from rayft.training.modeling.precision import Precision

    attention.register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)
    precision = Precision(None, False)
    examples = _examples(model.config.vocab_size)
    units = build_units([{**e, "sample_id": e["sample_ids"][0]} for e in examples], [[0, 1, 2], [3, 4, 5]])

    def loss_and_grads(batches: list[Any]) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        total = sum(b.num_label_tokens for b in batches)
        loss = sum(token_loss_sum(model, b, precision) for b in batches) / total
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in model.parameters()]

    packed_loss, packed_grads = loss_and_grads([collate(units, pad_token_id=0, pad_to_multiple_of=8)])
    single_loss, single_grads = loss_and_grads([collate([e], pad_token_id=0) for e in examples])
    # float32 both ways: the same sums per example, run in products of other shapes (the kernel may block
    # and order them otherwise). Each logit moves by ~sqrt(64) * 2**-24 of its terms (64: the hidden width),
    # the mean loss (~6.5) by ~1e-6 at most: abs 1e-5 is 1.5e-6 relative. A gradient entry sums over <= 64
    # positions: rtol 1e-5 (168 roundings), atol 1e-5 for the entries whose terms cancel.
    assert packed_loss == pytest.approx(single_loss, abs=1e-5)
    for packed, single in zip(packed_grads, single_grads, strict=True):
        torch.testing.assert_close(packed, single, atol=1e-5, rtol=1e-5)

    # The check can fail: without restarting positions, attention crosses examples.
    crossing = collate(units, pad_token_id=0)
    crossing.position_ids = torch.arange(crossing.input_ids.shape[1]).repeat(len(units), 1)
    leaked = float(token_loss_sum(model, crossing, precision).detach()) / crossing.num_label_tokens
    assert abs(leaked - single_loss) > 1e-3


def test_example_bounds_split_rows_where_positions_restart() -> None:
    import torch

    from rayft.training.modeling.attention import example_bounds

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    assert example_bounds(positions) == [[(0, 3), (3, 5), (5, 8)], [(0, 8)]]


def test_training_attention_is_per_example_only_for_sdpa_on_cpu() -> None:
    from rayft.training.modeling.attention import PER_EXAMPLE_SDPA, training_attention

    assert training_attention("sdpa", "cpu") == PER_EXAMPLE_SDPA
    assert training_attention("sdpa", "cuda") == "sdpa"
    assert training_attention("eager", "cpu") == "eager"
    assert training_attention("flash_attention_2", "cuda") == "flash_attention_2"


def test_per_example_attention_refuses_generation_inputs(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling import attention

    attention.register()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attention.PER_EXAMPLE_SDPA)
    ids = torch.tensor([[1, 2, 3, 4]])
    with pytest.raises(RuntimeError, match="for training without a cache"):
        model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1]]), position_ids=torch.arange(4)[None])
