"""Preference losses (DPO with its sigmoid and IPO forms, ORPO, SimPO) from per-sequence
log-probabilities, and the figures users read in TRL under the same names.

Every function returns one loss per pair, not a mean: the training loop sums loss terms over every
micro-batch on every worker and divides by their count (here: pairs), so an update does not depend
on how the pairs are split into workers and micro-batches.

The formulas follow the papers and TRL's implementations (tested against TRL's trainers):
DPO (Rafailov et al. 2023) with conservative label smoothing (cDPO), IPO (Azar et al. 2023, with
the per-token averaging TRL and the IPO authors use), ORPO (Hong et al. 2024) and SimPO (Meng et
al. 2024). They are written here rather than called from TRL because TRL computes them inside its
trainers' ``compute_loss`` (bound to an accelerate ``Trainer``), not as functions a Ray Train loop
can call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

PreferenceObjective = Literal["dpo", "orpo", "simpo"]
DpoLoss = Literal["sigmoid", "ipo"]


@dataclass(frozen=True)
class PairLogps:
    """Log-probabilities of the responses of a batch of pairs: sums over each response's tokens
    (shape ``(pairs,)``) and the number of those tokens."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    def mean_chosen(self) -> torch.Tensor:
        """Per-token average log-probability of each chosen response."""
        return self.chosen / self.chosen_tokens.clamp(min=1)

    def mean_rejected(self) -> torch.Tensor:
        """Per-token average log-probability of each rejected response."""
        return self.rejected / self.rejected_tokens.clamp(min=1)


@dataclass(frozen=True)
class PairLosses:
    """One loss per pair, and the rewards TRL logs for each side (no gradient)."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of log-probabilities of ``labels`` under ``logits`` per row, and the count of label
    tokens per row. ``logits`` ``(rows, positions, vocab)`` are aligned with ``labels``
    ``(rows, positions)`` (position ``i`` predicts ``labels[:, i]``); ``ignore_index`` marks positions
    that are not part of a response."""
    mask = labels != ignore_index
    return token_logps(logits, labels, ignore_index)[0].sum(-1), mask.sum(-1)


def token_logps(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> tuple[torch.Tensor]:
    """The log-probability of each of ``labels`` under ``logits`` (aligned as in :func:`sequence_logps`), 0
    where ``labels`` is ``ignore_index``: a one-tuple, the shape of a score the forward pass lays out."""
    import torch

    mask = labels != ignore_index
    safe = labels.masked_fill(~mask, 0)
    # log_softmax then gather, in float32: the sums of a few hundred log-probabilities lose the
    # reward differences in bfloat16.
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return (logps * mask,)


def dpo_losses(
    policy: PairLogps, reference: PairLogps, *, beta: float, label_smoothing: float = 0.0, loss: DpoLoss = "sigmoid"
) -> PairLosses:
    """DPO: ``-log sigmoid(beta * (policy-vs-reference log-ratio of chosen minus that of rejected))``,
    with ``label_smoothing`` the assumed probability that a pair's labels are flipped (cDPO); or IPO:
    ``(d - 1 / (2 beta))^2`` on the per-token averaged log-ratios."""
    from torch.nn.functional import logsigmoid

    chosen_ratio = policy.chosen - reference.chosen
    rejected_ratio = policy.rejected - reference.rejected
    if loss == "ipo":
        delta = chosen_ratio / policy.chosen_tokens.clamp(min=1) - rejected_ratio / policy.rejected_tokens.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        delta = chosen_ratio - rejected_ratio
        losses = -logsigmoid(beta * delta) * (1 - label_smoothing) - logsigmoid(-beta * delta) * label_smoothing
    return PairLosses(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def orpo_losses(policy: PairLogps, *, lam: float) -> PairLosses:
    """ORPO: the chosen response's mean negative log-likelihood minus ``lam`` times the log-sigmoid of
    the log odds ratio of chosen over rejected (per-token averaged log-probabilities, no reference).

    The likelihood term is each pair's own token mean (the paper's per-sequence average); TRL averages
    it over the chosen tokens of the whole batch, which is the same when chosen responses have equal
    lengths and, unlike TRL's, does not change with how pairs are grouped into batches."""
    from torch.nn.functional import logsigmoid

    chosen, rejected = policy.mean_chosen().float(), policy.mean_rejected().float()
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    losses = -chosen - lam * logsigmoid(log_odds)
    return PairLosses(losses, lam * chosen.detach(), lam * rejected.detach())


def simpo_losses(policy: PairLogps, *, beta: float, gamma: float, label_smoothing: float = 0.0) -> PairLosses:
    """SimPO: ``-log sigmoid(beta * (mean log-prob of chosen - that of rejected) - gamma)`` (no reference),
    with the same label smoothing as cDPO."""
    from torch.nn.functional import logsigmoid

    chosen, rejected = policy.mean_chosen(), policy.mean_rejected()
    logits = (chosen - rejected) - gamma / beta
    losses = -logsigmoid(beta * logits) * (1 - label_smoothing) - logsigmoid(-beta * logits) * label_smoothing
    return PairLosses(losses, beta * chosen.detach(), beta * rejected.detach())


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate near 0 and far below it (Maechler 2012)."""
    import torch

    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def pair_figure_tensors(policy: PairLogps, result: PairLosses, *, averaged: bool) -> dict[str, torch.Tensor]:
    """Sums over the batch's pairs of the figures TRL logs, by TRL's names (divide by the pairs of
    every worker for the means): rewards of each side, how often chosen out-rewards rejected, the
    margin, and the responses' log-probabilities (per-token averages for ORPO and SimPO, whose
    rewards are built on those; sums for DPO). Detached 0-d tensors: adding them up in a training
    step never waits on the device."""
    chosen = policy.mean_chosen() if averaged else policy.chosen
    rejected = policy.mean_rejected() if averaged else policy.rejected
    margins = result.chosen_rewards - result.rejected_rewards
    return {
        "rewards/chosen": result.chosen_rewards.sum(),
        "rewards/rejected": result.rejected_rewards.sum(),
        "rewards/accuracies": (result.chosen_rewards > result.rejected_rewards).float().sum(),
        "rewards/margins": margins.sum(),
        "logps/chosen": chosen.detach().sum(),
        "logps/rejected": rejected.detach().sum(),
    }


def pair_figure_sums(policy: PairLogps, result: PairLosses, *, averaged: bool) -> dict[str, float]:
    """:func:`pair_figure_tensors` as numbers."""
    return {name: float(value) for name, value in pair_figure_tensors(policy, result, averaged=averaged).items()}
