"""Shared prefixes in rollouts: a group's completions of one prompt come from one prefill of it, and sample
what the unshared rows sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.config.model import ModelConfig
from rayft.config.rl import RlConfig

# Left-padded to 7 tokens: three lengths, so the padding and the positions of the prefill are exercised.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
GROUP = 4


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from rayft.models.loading import load_causal_lm, load_tokenizer

    config = ModelConfig(name=str(tiny_model_dir))
    return load_causal_lm(config, "cpu"), load_tokenizer(config)


def sampler(tokenizer: Any, *, shared: bool, max_new_tokens: int = 12) -> Any:
    from rayft.training.methods.rl.sampling import Sampler

    settings = RlConfig(group_size=GROUP, max_new_tokens=max_new_tokens, rollout={"shared_prefix": shared})
    return Sampler(settings, tokenizer, "sdpa")


def forward_shapes(model: Any, run: Any) -> list[tuple[int, ...]]:
    """The (rows, tokens) of every forward pass ``run()`` makes through ``model``."""
    shapes: list[tuple[int, ...]] = []
    handle = model.get_input_embeddings().register_forward_pre_hook(lambda _, args: shapes.append(tuple(args[0].shape)))
    try:
        run()
    finally:
        handle.remove()
    return shapes


def test_a_group_is_prefilled_once_and_each_copy_forwards_only_its_last_prompt_token(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    shared = forward_shapes(model, lambda: sampler(tokenizer, shared=True).sample(model, PROMPTS, GROUP, seed=1))
    unshared = forward_shapes(model, lambda: sampler(tokenizer, shared=False).sample(model, PROMPTS, GROUP, seed=1))
    assert shared[:2] == [(3, 6), (12, 1)]  # the prompts once, less their last token; then that token per copy
    assert unshared[0] == (12, 7)  # every copy of every prompt
    assert set(shared[1:]) == set(unshared[1:]) == {(12, 1)}  # decoding is the same


@pytest.mark.parametrize("seed", [None, 7, 123])
def test_shared_prefixes_sample_the_tokens_of_the_unshared_rows(tiny: tuple[Any, Any], seed: int | None) -> None:
    """Greedy (seed None) and seeded sampling: the same logits up to float rounding, and the prefill draws no
    random number, so the same random stream picks the same tokens."""
    model, tokenizer = tiny
    shared = sampler(tokenizer, shared=True).sample(model, PROMPTS, GROUP, seed=seed)
    unshared = sampler(tokenizer, shared=False).sample(model, PROMPTS, GROUP, seed=seed)
    assert shared.token_ids == unshared.token_ids
    assert shared.generated_tokens == unshared.generated_tokens == sum(len(t) for t in shared.token_ids)
    assert len(shared.token_ids) == len(PROMPTS) * GROUP
    if seed is not None:  # sampling at temperature 1 over 512 tokens: the copies of a prompt differ
        assert len({tuple(t) for t in shared.token_ids[:GROUP]}) > 1


def test_the_logits_behind_each_sampled_token_equal_a_teacher_forced_forward(tiny: tuple[Any, Any]) -> None:
    """Every decoding step of the shared cache scores the sampled token as one forward over prompt + completion
    does (the trainer's log-probabilities, :meth:`Sampler.completion_logps`)."""
    import torch
    from transformers import GenerationConfig

    from rayft.training.methods.rl.shared_prefix import generate_shared, left_padded

    model, tokenizer = tiny
    sample = sampler(tokenizer, shared=True)
    input_ids, attention = left_padded(PROMPTS, sample.pad_id, "cpu")
    config = GenerationConfig(do_sample=True, max_new_tokens=10, temperature=1.0, top_p=1.0, top_k=0,
                              pad_token_id=sample.pad_id, eos_token_id=sample.eos_ids)  # fmt: skip
    torch.manual_seed(3)
    with torch.no_grad():
        out = generate_shared(model, input_ids, attention, GROUP, generation_config=config, output_logits=True,
                              return_dict_in_generate=True)  # fmt: skip
    width = input_ids.shape[1]
    completions = [sample.cut(row) for row in out.sequences[:, width:].tolist()]
    logps = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # (rows, steps, vocabulary)
    sampled = [[float(logps[r, j, t]) for j, t in enumerate(c)] for r, c in enumerate(completions)]
    repeated = [p for p in PROMPTS for _ in range(GROUP)]
    forced = sample.completion_logps(model, repeated, completions, rows_per_forward=len(repeated))
    # float32 both ways, summed in other orders (padded batch of 12 against 3 + decoding steps): each logit is
    # off by a few eps32 (1.2e-7) times its magnitude (< 10 here) times the depth (2 layers); 1e-5 bounds it.
    for got, want in zip(sampled, forced, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert sum(len(c) for c in completions) > len(completions)  # more than one step was compared


def test_one_token_prompts_have_nothing_to_share_and_still_sample(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    shared = sampler(tokenizer, shared=True, max_new_tokens=4).sample(model, [[5], [6]], GROUP, seed=2)
    unshared = sampler(tokenizer, shared=False, max_new_tokens=4).sample(model, [[5], [6]], GROUP, seed=2)
    assert shared.token_ids == unshared.token_ids
