"""The numbers of group-relative policy optimisation: advantages from a group's rewards, and the clipped
policy loss with its KL penalty, as sums of loss terms the training loop normalises.

The loss variants (``train.rl.loss``) differ only in what a loss term is, so that the loop's rule (the
sum of every worker's terms over their count) gives each paper's normalisation whatever the split into
workers and micro-batches:

- ``grpo``: a term is a completion, worth its mean token loss (DeepSeekMath);
- ``dr_grpo``: a term is a completion, worth its token-loss sum over ``max_new_tokens`` (Dr. GRPO);
- ``dapo``: a term is a completion token (DAPO's token-level mean).

The formulas are TRL's ``GRPOTrainer`` and ``RLOOTrainer``'s (tests compare them on the same inputs). The
loss variants and the advantage baselines (``train.rl.advantage``) sit in registries (:data:`POLICY_LOSSES`,
:data:`BASELINES`), each registered by decorator beside its formula: adding one touches this file (and the
config's list of names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from rayft.data.prepared import IGNORE_INDEX
from rayft.training.methods.unit import Registry

if TYPE_CHECKING:
    import torch

    from rayft.data.collate import MicroBatch

RlLoss = Literal["grpo", "dr_grpo", "dapo"]
Baseline = Literal["group", "rloo"]
Scale = Literal["group", "batch", "none"]
STD_EPS = 1e-4  # TRL's: a group whose rewards are all equal gets advantage 0, not a division by 0


class BaselineFn(Protocol):
    """An advantage baseline: each completion's reward less its baseline, ``(prompts, group_size)``."""

    def __call__(self, grouped: torch.Tensor) -> torch.Tensor: ...


class LossTerms(Protocol):
    """A loss variant: the sum of a micro-batch's loss terms and their count, from each row's sum of
    (masked) per-token losses ``token_sums``, the completion-token ``weights`` and ``mask``."""

    def __call__(
        self, token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
    ) -> tuple[torch.Tensor, int]: ...


BASELINES: Registry[BaselineFn] = Registry("train.rl.advantage")
POLICY_LOSSES: Registry[LossTerms] = Registry("train.rl.loss")


@BASELINES.register("group")
def group_mean_baseline(grouped: torch.Tensor) -> torch.Tensor:
    """GRPO's: less the group's mean reward."""
    return grouped - grouped.mean(dim=1, keepdim=True)


@BASELINES.register("rloo")
def leave_one_out_baseline(grouped: torch.Tensor) -> torch.Tensor:
    """RLOO's: less the mean reward of the group's other completions."""
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (grouped.shape[1] - 1)
    return grouped - others


def unbiased_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The standard deviation with Bessel's correction (as TRL's ``nanstd``)."""
    if dim is None:
        return values.std(unbiased=True) if values.numel() > 1 else values.new_zeros(())
    return values.std(dim=dim, unbiased=True)


def group_advantages(rewards: torch.Tensor, group_size: int, *, baseline: Baseline, scale: Scale) -> torch.Tensor:
    """Each completion's advantage: its reward less its group's baseline (the group mean, or RLOO's mean of
    the others), divided by the group's or the batch's reward standard deviation unless ``scale`` is 'none'.
    ``rewards`` holds ``group_size`` consecutive completions per prompt."""
    grouped = rewards.view(-1, group_size)
    advantages = BASELINES[baseline](grouped).reshape(-1)
    if scale == "group":
        advantages = advantages / (unbiased_std(grouped, dim=1).repeat_interleave(group_size) + STD_EPS)
    elif scale == "batch":
        advantages = advantages / (unbiased_std(rewards) + STD_EPS)
    return advantages


def token_logps_and_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log-probability of ``targets`` (``-100`` where none; those positions hold 0) and the
    entropy of the distribution (without gradient), from ``logits`` aligned with ``targets``."""
    import torch

    mask = targets != -100
    scores = logits.float()
    norm = torch.logsumexp(scores, dim=-1)
    logps = scores.gather(-1, targets.masked_fill(~mask, 0).unsqueeze(-1)).squeeze(-1) - norm
    with torch.no_grad():
        entropy = norm - (torch.softmax(scores, dim=-1) * scores).sum(-1)
    return logps * mask, entropy * mask


def completion_logps(
    model: torch.nn.Module, rows: MicroBatch, autocast_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities and entropies of the rows' labelled (completion) tokens under ``model``, and
    their mask, at the positions some row trains on (``logits_to_keep``: prompts skip the vocabulary
    projection); ``(rows, kept positions)`` each, the kept positions those of :func:`kept_positions`."""
    import contextlib

    import torch

    keep = kept_positions(rows.labels)
    autocast = (
        torch.autocast(device_type=rows.input_ids.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with autocast:
        logits = model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False,
                       logits_to_keep=keep).logits  # fmt: skip
    kept = rows.labels[:, 1:][:, keep]
    logps, entropy = token_logps_and_entropy(logits, kept)
    return logps, entropy, kept != IGNORE_INDEX


def kept_positions(labels: torch.Tensor) -> torch.Tensor:
    """The target positions (of ``labels[:, 1:]``) at which some row has a labelled token."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().flatten()


def importance_weights(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights ``min(pi_prox / pi_behaviour, cap)`` per completion token (1 where
    ``mask`` is off), without gradient: the correction of a loss taken against the policy at the start of
    the step (``proximal``) for completions that older weights sampled (``behaviour``), as decoupled PPO
    and truncated importance sampling weigh stale rollouts."""
    import torch

    with torch.no_grad():
        weights = torch.exp(proximal - behaviour).clamp(max=cap)
    return torch.where(mask, weights, torch.ones_like(weights))


@dataclass(frozen=True)
class PolicyLossSettings:
    """What the policy loss needs from ``train.rl``."""

    loss: RlLoss = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    kl_coef: float = 0.0
    max_new_tokens: int = 128


@dataclass(frozen=True)
class PolicyLoss:
    """The loss of a micro-batch of completions: ``loss_sum`` over ``terms`` loss terms, and the sums behind
    the step's figures (over the batch's ``tokens`` completion tokens)."""

    loss_sum: torch.Tensor
    terms: int
    tokens: float
    kl_sum: float
    low_clipped: float
    high_clipped: float


def policy_loss(  # noqa: PLR0917 - the tensors of one formula, in its order
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicyLossSettings,
    token_weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """The clipped surrogate ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` per completion token (``r``
    the probability ratio to the sampling policy's ``old_logps``), plus ``kl_coef`` times the k3 estimate of
    the KL divergence to ``ref_logps``, summed into the loss terms of ``settings.loss``. Every tensor but
    ``advantages`` (one per row) is ``(rows, positions)``; ``mask`` marks completion tokens; ``token_weights``
    (:func:`importance_weights`, for stale rollouts) scale each token's surrogate term."""
    import torch

    weights = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    column = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    per_token = -torch.min(ratio * column, clipped * column)
    if token_weights is not None:
        per_token = per_token * token_weights
    kl_sum = 0.0
    if ref_logps is not None and settings.kl_coef != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + settings.kl_coef * kl
        kl_sum = float((kl.detach() * weights).sum())
    token_sums = (per_token * weights).sum(-1)
    loss_sum, terms = POLICY_LOSSES[settings.loss](token_sums, weights, mask, settings)
    with torch.no_grad():
        low = ((ratio < 1 - settings.epsilon_low) & (column < 0) & mask).sum()
        high = ((ratio > 1 + settings.epsilon_high) & (column > 0) & mask).sum()
    return PolicyLoss(loss_sum, terms, float(weights.sum()), kl_sum, float(low), float(high))


@POLICY_LOSSES.register("grpo")
def completion_mean_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """GRPO (DeepSeekMath): a term is a completion, worth its mean token loss."""
    return (token_sums / weights.sum(-1).clamp(min=1.0)).sum(), int(mask.shape[0])


@POLICY_LOSSES.register("dr_grpo")
def fixed_length_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """Dr. GRPO: a term is a completion, worth its token-loss sum over ``max_new_tokens``."""
    return token_sums.sum() / settings.max_new_tokens, int(mask.shape[0])


@POLICY_LOSSES.register("dapo")
def token_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """DAPO: a term is a completion token (the token-level mean)."""
    return token_sums.sum(), int(mask.sum())
