"""The numbers of KL-regularised SFT: each label token's cross-entropy plus ``beta`` times the KL divergence
from the policy's next-token distribution to the base model's at that position, over the whole vocabulary
(the exact divergence, not a sampled estimate). The KL term is TRL's ``GKDTrainer.generalized_jsd_loss`` with
``beta=1`` (its reverse KL); a test compares them on the same logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayft.data.prepared import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KlSftLoss:
    """A micro-batch's loss sum (one term per label token) and the sums behind its figures."""

    loss_sum: torch.Tensor
    nll_sum: float
    kl_sum: float


def kl_sft_loss(logits: torch.Tensor, ref_logits: torch.Tensor, targets: torch.Tensor, beta: float) -> KlSftLoss:
    """The loss of positions whose next token is ``targets`` (``-100``: no loss there), from the policy's
    ``logits`` and the base model's ``ref_logits`` at the same positions: ``(rows, positions, vocab)``."""
    import torch

    mask = targets != IGNORE_INDEX
    logps = torch.log_softmax(logits.float(), dim=-1)
    ref_logps = torch.log_softmax(ref_logits.float(), dim=-1)
    nll = -logps.gather(-1, targets.masked_fill(~mask, 0).unsqueeze(-1)).squeeze(-1)
    kl = (logps.exp() * (logps - ref_logps)).sum(-1)
    nll_sum, kl_sum = (nll * mask).sum(), (kl * mask).sum()
    return KlSftLoss(nll_sum + beta * kl_sum, float(nll_sum.detach()), float(kl_sum.detach()))
