"""The preference objective on a tiny model: DPO starts at ln 2 with zero margins (LoRA: the adapter
off is the reference; full: stored reference log-probabilities), full DPO without stored references
is refused, and a few steps on a separable preference set make chosen out-reward rejected."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rayft.config.preference import PreferenceConfig  # noqa: E402
from rayft.errors import ConfigError  # noqa: E402
from rayft.training.methods.preference.method import PreferenceTraining, collate_preference, pair_logps  # noqa: E402
from rayft.training.modeling.precision import Precision  # noqa: E402

X = -100


def _precision() -> Precision:
    return Precision(autocast_dtype=None, use_grad_scaler=False)


def _units(pairs: int, *, good: int = 7, bad: int = 9, seed: int = 0) -> list[dict[str, Any]]:
    """Pairs with a random 4-token prompt; the chosen response is ``good`` twice, the rejected ``bad`` twice."""
    generator = torch.Generator().manual_seed(seed)
    units = []
    for index in range(pairs):
        prompt = [int(t) for t in torch.randint(20, 60, (4,), generator=generator)]
        units.append({
            "chosen_input_ids": [*prompt, good, good], "chosen_labels": [X] * 4 + [good, good],
            "rejected_input_ids": [*prompt, bad, bad], "rejected_labels": [X] * 4 + [bad, bad],
            "sample_ids": [index],
        })  # fmt: skip
    return units


def _objective(name: str, **settings: Any) -> PreferenceTraining:
    plan = SimpleNamespace(model=SimpleNamespace(attn_implementation="sdpa"), train=SimpleNamespace(padding_free=False))
    lm = SimpleNamespace(plan=plan, tokenizer=SimpleNamespace(pad_token_id=0), model_type="llama")
    return PreferenceTraining(lm, name, PreferenceConfig(**settings))  # type: ignore[arg-type]


def _lora(tiny_model_dir: Path) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_dpo_on_lora_starts_at_ln2_with_zero_margins(tiny_model_dir: Path) -> None:
    model, objective = _lora(tiny_model_dir), _objective("dpo")
    batch = objective.collate(_units(4))
    loss = objective.loss_sum(model, batch, _precision())
    # With zero margins each pair's loss is -log sigmoid(0) = ln 2 exactly up to float32's rounding of the
    # difference of two equal sums (0 exactly: the same operations) and of log-sigmoid: a few 2**-24.
    assert float(loss.detach()) == pytest.approx(4 * math.log(2), abs=1e-5)
    figures = objective.take_figures(torch.device("cpu"), 4)
    assert figures["rewards/margins"] == 0.0 and figures["rewards/accuracies"] == 0.0
    assert figures["logps/chosen"] < 0 and objective.figure_sums == {}
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_full_dpo_uses_the_stored_reference_and_refuses_without_one(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    objective, units = _objective("dpo"), _units(3)
    with torch.no_grad():
        reference = pair_logps(model, collate_preference(units, 0).rows, _precision())
    stored = [{**u, "ref_chosen_logps": float(c), "ref_rejected_logps": float(r)}
              for u, c, r in zip(units, reference.chosen, reference.rejected, strict=True)]  # fmt: skip
    loss = objective.loss_sum(model, objective.collate(stored), _precision())
    assert float(loss.detach()) == pytest.approx(3 * math.log(2), abs=1e-5)
    with pytest.raises(ConfigError, match="reference log-probabilities stored"):
        objective.loss_sum(model, objective.collate(units), _precision())


def test_pairs_are_one_loss_term_each_and_rows_are_chosen_then_rejected() -> None:
    batch = collate_preference(_units(3), pad_token_id=0)
    assert batch.num_label_tokens == 3 and batch.rows.input_ids.shape == (6, 6)
    assert batch.sample_ids == [0, 1, 2] and batch.num_tokens == 36
    assert batch.rows.input_ids[0, -1] == 7 and batch.rows.input_ids[3, -1] == 9


@pytest.mark.parametrize(
    ("name", "settings"), [("dpo", {"beta": 0.5}), ("orpo", {"orpo_lambda": 1.0}), ("simpo", {"beta": 2.0})]
)
def test_a_few_steps_on_separable_pairs_make_chosen_out_reward_rejected(
    tiny_model_dir: Path, name: str, settings: dict[str, Any]
) -> None:
    model, objective = _lora(tiny_model_dir), _objective(name, **settings)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    train, held_out = _units(8, seed=1), _units(16, seed=2)
    for _ in range(25):
        optimizer.zero_grad()
        (objective.loss_sum(model, objective.collate(train), _precision()) / len(train)).backward()
        optimizer.step()
    figures = objective.evaluate(model, held_out, batch_size=8, precision=_precision(), device=torch.device("cpu"),
                                 lockstep=False)  # fmt: skip
    assert figures["eval/rewards/accuracies"] > 0.9, figures
    assert figures["eval/rewards/margins"] > 0
