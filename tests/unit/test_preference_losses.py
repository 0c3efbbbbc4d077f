"""The preference losses against TRL's own trainers as the oracle, on random logits.

TRL computes its losses inside ``compute_loss`` methods bound to a ``Trainer``; the tests call those
methods with the few attributes they read, and with a model stand-in that returns the per-token
log-probabilities TRL's fused head would return for the same random logits, so every formula is
TRL's own code.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rayft.training.methods.preference.losses import (  # noqa: E402
    PairLogps,
    dpo_losses,
    log1mexp,
    orpo_losses,
    pair_figure_sums,
    sequence_logps,
    simpo_losses,
)

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics

PAIRS, LENGTH, VOCAB = 4, 12, 17


def _batch(seed: int, *, equal_lengths: bool = False) -> dict[str, torch.Tensor]:
    """Random logits and token ids for ``2 * PAIRS`` rows (chosen rows first, then rejected), each a
    prompt followed by a response; the completion mask marks the response."""
    generator = torch.Generator().manual_seed(seed)
    rows = 2 * PAIRS
    input_ids = torch.randint(0, VOCAB, (rows, LENGTH), generator=generator)
    logits = torch.randn(rows, LENGTH, VOCAB, generator=generator) * 3
    completion = torch.zeros(rows, LENGTH, dtype=torch.long)
    for row in range(rows):
        start = 4 if equal_lengths else int(torch.randint(2, 6, (1,), generator=generator))
        end = LENGTH if equal_lengths else int(torch.randint(start + 2, LENGTH + 1, (1,), generator=generator))
        completion[row, start:end] = 1
    return {"input_ids": input_ids, "logits": logits, "completion_mask": completion}


def _logps(batch: dict[str, torch.Tensor]) -> PairLogps:
    """rayft's per-sequence log-probabilities of the batch's responses (position i predicts i+1)."""
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)[:, 1:]
    sums, counts = sequence_logps(batch["logits"][:, :-1], labels)
    return PairLogps(sums[:PAIRS], sums[PAIRS:], counts[:PAIRS], counts[PAIRS:])


def _trl_dpo(
    batch: dict[str, torch.Tensor], ref: PairLogps, *, loss_type: str, beta: float
) -> tuple[float, dict[str, Any]]:
    """TRL's ``DPOTrainer._compute_loss`` on the batch, with precomputed reference log-probabilities."""
    from trl import DPOTrainer

    shift_mask = batch["completion_mask"][:, 1:]
    token_logps = torch.log_softmax(batch["logits"][:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])
    log_probs = token_logps.squeeze(-1) * shift_mask  # the fused head's output: zero off the completion
    zeros = torch.zeros_like(log_probs)

    def model(**_: Any) -> SimpleNamespace:
        return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}
    accelerator = SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0],
        beta=beta, label_smoothing=0.0, use_weighting=False, _metrics=metrics, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    inputs = {
        "input_ids": batch["input_ids"], "attention_mask": torch.ones_like(batch["input_ids"]),
        "completion_mask": batch["completion_mask"], "ref_chosen_logps": ref.chosen, "ref_rejected_logps": ref.rejected,
    }  # fmt: skip
    loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return float(loss), {name: values[-1] for name, values in metrics["train"].items()}


def _reference(seed: int) -> PairLogps:
    generator = torch.Generator().manual_seed(seed)
    return PairLogps(-20 * torch.rand(PAIRS, generator=generator), -20 * torch.rand(PAIRS, generator=generator),
                     torch.ones(PAIRS), torch.ones(PAIRS))  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_sigmoid_loss_and_figures_equal_trls(seed: int, beta: float) -> None:
    batch, ref = _batch(seed), _reference(seed + 100)
    policy = _logps(batch)
    result = dpo_losses(policy, ref, beta=beta)
    trl_loss, trl_metrics = _trl_dpo(batch, ref, loss_type="sigmoid", beta=beta)
    # The same float32 formula per pair, in TRL's order or ours: a log-ratio is a difference of sums of
    # log-probabilities of magnitude <= 20 (each within 2**-24 relative: ~1e-6 absolute), scaled by beta <= 0.5,
    # and log-sigmoid amplifies an absolute error by at most 1; a loss of ~0.7 then moves by ~5e-7: 1e-5 leaves
    # 10x for the mean's summation. A wrong sign, beta or reference moves it by 1e-2 and up.
    assert float(result.losses.mean()) == pytest.approx(trl_loss, rel=1e-5)
    figures = {name: value / PAIRS for name, value in pair_figure_sums(policy, result, averaged=False).items()}
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                 "logps/rejected"):  # fmt: skip
        assert figures[name] == pytest.approx(trl_metrics[name], rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("seed", [3, 4])
def test_ipo_loss_equals_trls(seed: int) -> None:
    batch, ref = _batch(seed), _reference(seed + 100)
    result = dpo_losses(_logps(batch), ref, beta=0.3, loss="ipo")
    trl_loss, _ = _trl_dpo(batch, ref, loss_type="ipo", beta=0.3)
    assert float(result.losses.mean()) == pytest.approx(trl_loss, rel=1e-5)


def test_dpo_label_smoothing_is_the_conservative_form_trl_uses() -> None:
    """cDPO: TRL's CPO trainer carries the same label-smoothed sigmoid (on policy log-probabilities
    alone); fed the log-ratios, it must give DPO's loss with smoothing."""
    from trl.experimental.cpo import CPOTrainer

    batch, ref = _batch(5), _reference(105)
    policy = _logps(batch)
    result = dpo_losses(policy, ref, beta=0.2, label_smoothing=0.1)
    cpo = SimpleNamespace(alpha=0.0, beta=0.2, label_smoothing=0.1, loss_type="sigmoid",
                          accelerator=SimpleNamespace(device="cpu"))  # fmt: skip
    trl_losses, _, _ = CPOTrainer.cpo_loss(cpo, policy.chosen - ref.chosen, policy.rejected - ref.rejected)
    torch.testing.assert_close(result.losses, trl_losses, rtol=1e-5, atol=1e-6)


def test_dpo_starts_at_ln2_with_zero_margins_when_the_policy_is_the_reference() -> None:
    policy = _logps(_batch(6))
    result = dpo_losses(policy, policy, beta=0.1)
    torch.testing.assert_close(result.losses, torch.full((PAIRS,), math.log(2)))
    figures = pair_figure_sums(policy, result, averaged=False)
    assert figures["rewards/margins"] == 0.0 and figures["rewards/accuracies"] == 0.0


@pytest.mark.parametrize("seed", [7, 8])
def test_sequence_log_probability_means_equal_trls(seed: int) -> None:
    from trl.experimental.orpo import ORPOTrainer

    batch = _batch(seed)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    trl_means = ORPOTrainer.get_batch_logps(batch["logits"], labels, average_log_prob=True)
    policy = _logps(batch)
    torch.testing.assert_close(torch.cat([policy.mean_chosen(), policy.mean_rejected()]), trl_means)


@pytest.mark.parametrize("seed", [9, 10])
def test_orpo_odds_ratio_term_and_rewards_equal_trls(seed: int) -> None:
    """ORPO = chosen NLL (each pair's token mean) - lambda * log sigmoid(log odds ratio): the odds
    ratio term and the rewards are TRL's ``odds_ratio_loss`` (its ``beta`` is ORPO's lambda)."""
    from trl.experimental.orpo import ORPOTrainer

    policy = _logps(_batch(seed, equal_lengths=True))
    result = orpo_losses(policy, lam=0.25)
    orpo = SimpleNamespace(beta=0.25, accelerator=SimpleNamespace(device="cpu"))
    ratio_terms, chosen_rewards, rejected_rewards, _, _ = ORPOTrainer.odds_ratio_loss(
        orpo, policy.mean_chosen(), policy.mean_rejected()
    )
    nll = -policy.mean_chosen()
    torch.testing.assert_close(result.losses, nll - ratio_terms, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.chosen_rewards, chosen_rewards)
    torch.testing.assert_close(result.rejected_rewards, rejected_rewards)


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_simpo_loss_and_rewards_equal_trls(seed: int, smoothing: float) -> None:
    from trl.experimental.cpo import CPOTrainer

    policy = _logps(_batch(seed))
    result = simpo_losses(policy, beta=2.0, gamma=0.5, label_smoothing=smoothing)
    cpo = SimpleNamespace(alpha=0.0, beta=2.0, simpo_gamma=0.5, label_smoothing=smoothing, loss_type="simpo",
                          accelerator=SimpleNamespace(device="cpu"))  # fmt: skip
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(cpo, policy.mean_chosen(), policy.mean_rejected())
    torch.testing.assert_close(result.losses, losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.chosen_rewards, chosen_rewards)
    torch.testing.assert_close(result.rejected_rewards, rejected_rewards)


def test_log1mexp_is_accurate_near_zero_and_far_below() -> None:
    from decimal import Decimal, getcontext

    getcontext().prec = 60
    points = [-1e-8, -1e-3, -0.5, -5.0, -50.0]
    exact = [float((1 - Decimal(p).exp()).ln()) for p in points]  # to 60 digits
    torch.testing.assert_close(log1mexp(torch.tensor(points, dtype=torch.float64)),
                               torch.tensor(exact, dtype=torch.float64), rtol=1e-12, atol=0.0)  # fmt: skip
    assert torch.isfinite(log1mexp(torch.tensor([-1e-30]))).all()
