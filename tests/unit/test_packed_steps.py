"""Padding-free (packed) preference and GRPO steps: a micro-batch's sequences laid end to end in one row
give the padded step's loss and gradients, for every attention implementation a CPU trains with.

Tolerances. A float32 sum of n terms is within n * u * sum|terms| of the exact sum (u = 2**-24, Higham's
gamma_n), and a forward pass composes such sums: per layer the projections (hidden size terms), the MLP
(intermediate size), attention over at most the longest sequence; then the head (hidden size), the
log-softmax over the vocabulary and the loss's sum over the batch's tokens. Packed and padded rows compute the
same sums (padding never enters a real token's), only batched differently, so both are within R * u of the
exact value relative to the magnitudes involved, R the total of those reduction lengths, and within 2 * R * u
of each other. The bound is loose against rounding (the observed gaps are far below it) but tight against a
mistake: a sequence attending to another, or a log-probability gathered from the wrong position, moves the
values by their own size (the control below shows the gap of attention crossing sequences exceeds it).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rayft.config import load_config  # noqa: E402
from rayft.config.preference import PreferenceConfig  # noqa: E402
from rayft.config.rl import RlConfig  # noqa: E402
from rayft.data.collate import collate, unpack_targets  # noqa: E402
from rayft.data.prepared import IGNORE_INDEX  # noqa: E402
from rayft.errors import ConfigError  # noqa: E402
from rayft.training.methods.preference.method import PreferenceTraining  # noqa: E402
from rayft.training.methods.rl.method import RlTraining  # noqa: E402
from rayft.training.methods.rl.sampling import Completions, PromptBatch  # noqa: E402
from rayft.training.modeling.attention import PER_EXAMPLE_SDPA, register  # noqa: E402
from rayft.training.modeling.precision import Precision  # noqa: E402

X = IGNORE_INDEX
U = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff, 2**-24
TRAINING_ATTENTION = ["eager", "sdpa", PER_EXAMPLE_SDPA]  # what a CPU trains with (flex_attention has no CPU backward)


def _reduction_length(model: Any, longest: int, tokens: int) -> int:
    """R of the module docstring: the reduction lengths a loss term is computed through."""
    config = model.config
    per_layer = 4 * config.hidden_size + config.intermediate_size + longest  # q, k, v, o; down; attention
    return config.num_hidden_layers * per_layer + config.hidden_size + config.vocab_size + tokens


def _bound(model: Any, longest: int, tokens: int, scale: float) -> float:
    return 2 * _reduction_length(model, longest, tokens) * U * scale


def _model(tiny_model_dir: Path, attention: str, *, lora: bool) -> Any:
    """The tiny model with ``attention``; with ``lora``, an adapter whose B is random, so that switching it off
    (the reference of DPO and of GRPO's KL term) changes the log-probabilities."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.set_attn_implementation(attention)
    if not lora:
        return model
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    return model


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _plan(padding_free: bool, attention: str) -> Any:
    return SimpleNamespace(model=SimpleNamespace(attn_implementation=attention),
                           train=SimpleNamespace(padding_free=padding_free, method="lora"))  # fmt: skip


def _precision() -> Precision:
    return Precision(autocast_dtype=None, use_grad_scaler=False)


def test_packed_rows_lay_every_target_back_where_the_padded_rows_have_it() -> None:
    units = [
        {"input_ids": [1, 2, 3, 4, 5], "labels": [X, X, 3, 4, 5], "position_ids": range(5), "sample_ids": [0]},
        {"input_ids": [6, 7], "labels": [6, 7], "position_ids": range(2), "sample_ids": [1]},
        {"input_ids": [8, 9, 10], "labels": [X, 9, 10], "position_ids": range(3), "sample_ids": []},
    ]
    rows = collate(units, 0, packed=True)
    packed = rows.packed
    assert packed is not None
    assert packed.row.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    assert packed.row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1, 2]]
    # Each sequence's first label is out: end to end, the previous sequence's last token would predict it.
    assert packed.row.labels.tolist() == [[X, X, 3, 4, 5, X, 7, X, 9, 10]]
    assert rows.num_computed_tokens == 10 < rows.input_ids.numel() == 15
    # The packed row's targets, laid back, are the padded rows' targets, position for position.
    layout = torch.arange(rows.labels.shape[1] - 1)
    kept = torch.arange(packed.row.labels.shape[1] - 1)
    back = unpack_targets(packed.row.labels[:, 1:].float(), kept, packed, layout)
    inside = packed.targets >= 0
    assert torch.equal(back[inside], rows.labels[:, 1:][inside].float())
    assert torch.equal(rows.labels[:, 1:][~inside], torch.full_like(rows.labels[:, 1:][~inside], X))


# transformers' flex path calls torch APIs that torch 2.13 deprecates (create_block_mask's _compile flag,
# torch.jit.script_method); flex_attention trains on GPUs only, and its forward is checked here, in the slow
# tier: transformers always compiles flex_attention, and on a machine whose inductor cache is cold (every CI
# run) that compile took 45 s of a 2-core machine alone and 190 s beside the rest of the unit tier.
FLEX = pytest.param(
    "flex_attention", marks=[pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
)


@pytest.mark.parametrize("attention", [*TRAINING_ATTENTION, FLEX])
def test_attention_keeps_to_each_sequence_of_a_packed_row(tiny_model_dir: Path, attention: str) -> None:
    """transformers derives a block-diagonal causal mask from the position restarts (no attention mask passed)
    under every implementation here: a packed row's logits are each sequence's own."""
    model = _model(tiny_model_dir, attention, lora=False).eval()
    generator = torch.Generator().manual_seed(1)
    lengths = [7, 13, 4, 10]
    sequences = [torch.randint(10, 400, (n,), generator=generator) for n in lengths]
    ids = torch.cat(sequences)[None]
    restarts = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=restarts, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in sequences])
        crossing = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits[0]
    bound = _bound(model, max(lengths), 0, float(alone.abs().max()))
    assert float((packed - alone).abs().max()) <= bound
    # The control: without the restarts, attention crosses sequences and the logits move past the bound.
    assert float((crossing - alone).abs().max()) > 10 * bound


def _pairs(count: int, seed: int) -> list[dict[str, Any]]:
    """Pairs of uneven lengths: prompts of 3-9 tokens, responses of 1-12."""
    generator = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> list[int]:
        n = int(torch.randint(low, high + 1, (1,), generator=generator))
        return [int(t) for t in torch.randint(10, 400, (n,), generator=generator)]

    units = []
    for index in range(count):
        prompt, chosen, rejected = draw(3, 9), draw(1, 12), draw(1, 12)
        units.append({
            "chosen_input_ids": prompt + chosen, "chosen_labels": [X] * len(prompt) + chosen,
            "rejected_input_ids": prompt + rejected, "rejected_labels": [X] * len(prompt) + rejected,
            "sample_ids": [index],
        })  # fmt: skip
    return units


def _preference_step(
    model: Any, objective: str, units: list[dict[str, Any]], *, padding_free: bool, attention: str
) -> tuple[float, dict[str, torch.Tensor], dict[str, float], int]:
    lm = SimpleNamespace(plan=_plan(padding_free, attention), tokenizer=SimpleNamespace(pad_token_id=0),
                         model_type="llama")  # fmt: skip
    training = PreferenceTraining(lm, objective, PreferenceConfig(beta=0.5))  # type: ignore[arg-type]
    batch = training.collate(units)
    assert (batch.rows.packed is not None) == padding_free
    model.zero_grad()
    loss = training.loss_sum(model, batch, _precision())
    loss.backward()
    figures = {name: float(value) for name, value in training.figure_sums.items()}
    return float(loss.detach()), _grads(model), figures, batch.num_computed_tokens


@pytest.mark.parametrize("attention", TRAINING_ATTENTION)
@pytest.mark.parametrize("objective", ["dpo", "simpo", "orpo"])
def test_a_packed_preference_step_equals_the_padded_one(tiny_model_dir: Path, objective: str, attention: str) -> None:
    model = _model(tiny_model_dir, attention, lora=True)
    units = _pairs(5, seed=2)
    padded = _preference_step(model, objective, units, padding_free=False, attention=attention)
    packed = _preference_step(model, objective, units, padding_free=True, attention=attention)
    longest = max(len(u[f"{side}_input_ids"]) for u in units for side in ("chosen", "rejected"))
    tokens = sum(len(u[f"{side}_input_ids"]) for u in units for side in ("chosen", "rejected"))
    assert packed[3] == tokens < padded[3]  # the packed forward computes no padding
    # DPO's, SimPO's and ORPO's pair losses are positive: their sum is the sum of their magnitudes.
    assert packed[0] == pytest.approx(padded[0], rel=0, abs=_bound(model, longest, tokens, padded[0]))
    assert padded[1].keys() == packed[1].keys() and padded[1]
    for name, grad in padded[1].items():
        bound = _bound(model, longest, tokens, float(grad.abs().max()))
        torch.testing.assert_close(packed[1][name], grad, rtol=0, atol=bound, msg=name)
    for name, value in padded[2].items():  # TRL's figures: log-probability sums, rewards, margins
        assert packed[2][name] == pytest.approx(value, rel=0, abs=_bound(model, longest, tokens, 1 + abs(value)))


def _grpo_step(
    model: Any, tokenizer: Any, *, padding_free: bool, attention: str
) -> tuple[float, dict[str, torch.Tensor], dict[str, float], int]:
    settings = RlConfig(rewards=[{"function": "exact_match"}], group_size=4, kl_coef=0.1, loss="grpo",
                        steps_per_rollout=2, completions_per_forward=8)  # fmt: skip
    lm = SimpleNamespace(plan=_plan(padding_free, attention), tokenizer=tokenizer, seq2seq=False, model_type="llama")
    training = RlTraining.build(lm, settings, seed=0)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(3)
    prompts = [[int(t) for t in torch.randint(10, 400, (n,), generator=generator)] for n in (5, 11)]
    eos = tokenizer.eos_token_id
    lengths = (1, 9, 4, 14, 2, 6, 12, 3)  # uneven completions, some cut short of their end of sequence
    completions = [[*torch.randint(10, 400, (n,), generator=generator).tolist(), *([eos] if n % 3 else [])]
                   for n in lengths]  # fmt: skip
    sampled = Completions(completions, [""] * len(completions), sum(map(len, completions)), 0.0)
    rewards = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.0, 0.75]
    batch = PromptBatch(prompts, ["", ""], [0, 1])
    model.zero_grad()
    (rollout,) = training.to_rollout(model, batch, sampled, rewards, _precision())
    assert (rollout.rows.packed is not None) == padding_free
    assert rollout.ref_logps is not None and rollout.old_logps is not None  # three forwards, all packed or not
    loss = training.loss_sum(model, rollout, _precision())
    loss.backward()
    return float(loss.detach()), _grads(model), dict(training.record.sums), rollout.num_computed_tokens


@pytest.mark.parametrize("attention", TRAINING_ATTENTION)
def test_a_packed_grpo_step_equals_the_padded_one(tiny_model_dir: Path, attention: str) -> None:
    """The policy, old-policy and reference (the adapter off) forwards of a group's completions."""
    from rayft.config.model import ModelConfig
    from rayft.models.loading import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    model = _model(tiny_model_dir, attention, lora=True)
    padded = _grpo_step(model, tokenizer, padding_free=False, attention=attention)
    packed = _grpo_step(model, tokenizer, padding_free=True, attention=attention)
    tokens, longest = packed[3], 11 + 15
    assert tokens < padded[3]
    # A GRPO loss term is a completion's mean token loss, |advantage| * ratio (1 here) + kl_coef * k3: below
    # 2 + 0.1 * k3 each; the figures' entropies and KL sums are over every completion token.
    scale = 8 * 3.0
    assert packed[0] == pytest.approx(padded[0], rel=0, abs=_bound(model, longest, tokens, scale))
    assert padded[1].keys() == packed[1].keys() and padded[1]
    for name, grad in padded[1].items():
        bound = _bound(model, longest, tokens, float(grad.abs().max()))
        torch.testing.assert_close(packed[1][name], grad, rtol=0, atol=bound, msg=name)
    assert padded[2].keys() == packed[2].keys()
    for name, value in padded[2].items():
        assert packed[2][name] == pytest.approx(value, rel=0, abs=_bound(model, longest, tokens, tokens + abs(value)))


@pytest.mark.parametrize("objective", ["dpo", "orpo", "simpo", "grpo"])
def test_padding_free_steps_are_accepted_and_offered_where_data_packing_is_refused(objective: str) -> None:
    assert load_config(None, [f"train.objective={objective}", "train.padding_free=true"]).train.padding_free is True
    offer = r"set data.packing=false \(train.padding_free=true lays each micro-batch's sequences end to end\)"
    with pytest.raises(ConfigError, match=offer):
        load_config(None, [f"train.objective={objective}", "data.packing=true"])
