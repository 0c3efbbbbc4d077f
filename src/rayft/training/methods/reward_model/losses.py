"""The numbers of a Bradley-Terry reward model: each pair's loss from the scores of its chosen and rejected
responses, ``-log sigmoid(r_chosen - r_rejected - margin)``, plus optionally ``c * (r_chosen + r_rejected)^2``
to keep the scores centred. Their mean over a batch is TRL ``RewardTrainer.compute_loss``'s loss (a test
compares them on the same model and pairs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FIGURES = ("accuracy", "margin", "chosen", "rejected")
"""The figures of a batch of pairs, summed over its pairs: how often chosen out-scores rejected, the mean gap,
and each side's mean score."""


@dataclass(frozen=True)
class PairScores:
    """The reward model's score of each pair's chosen and of its rejected response, shape ``(pairs,)``."""

    chosen: torch.Tensor
    rejected: torch.Tensor


def bradley_terry_losses(
    scores: PairScores, *, margin: float = 0.0, center_coefficient: float | None = None
) -> torch.Tensor:
    """Each pair's loss: the negative log-likelihood that chosen beats rejected by at least ``margin`` under
    the Bradley-Terry model, plus ``center_coefficient`` times the squared sum of the two scores."""
    from torch.nn.functional import logsigmoid

    chosen, rejected = scores.chosen.float(), scores.rejected.float()
    losses = -logsigmoid(chosen - rejected - margin)
    if center_coefficient is not None:
        losses = losses + center_coefficient * (chosen + rejected) ** 2
    return losses


def figure_sums(scores: PairScores) -> dict[str, torch.Tensor]:
    """Sums over the pairs of :data:`FIGURES` (divide by every worker's pairs for the means): detached 0-d
    tensors, so that adding them up in a training step never waits on the device."""
    chosen, rejected = scores.chosen.detach().float(), scores.rejected.detach().float()
    return {
        "accuracy": (chosen > rejected).float().sum(),
        "margin": (chosen - rejected).sum(),
        "chosen": chosen.sum(),
        "rejected": rejected.sum(),
    }
