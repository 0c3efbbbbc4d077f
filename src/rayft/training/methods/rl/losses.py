"""The numbers of group-relative policy optimisation: advantages from a group's rewards, and the clipped
policy loss with its KL penalty, as sums of loss terms the training loop normalises.

The loss variants (``train.rl.loss``) differ only in what a loss term is, so that the loop's rule (the
sum of every worker's terms over their count) gives each paper's normalisation whatever the split into
workers and micro-batches:

- ``grpo``: a term is a completion, worth its mean token loss (DeepSeekMath);
- ``dr_grpo``: a term is a completion, worth its token-loss sum over ``max_new_tokens`` (Dr. GRPO);
- ``dapo``: a term is a completion token (DAPO's token-level mean);
- ``gspo``: GRPO's terms with one importance ratio per completion, the geometric mean of its tokens' (GSPO,
  TRL's ``importance_sampling_level="sequence"``);
- ``cispo``: the clipped importance weight, without gradient, times the advantage and the token's
  log-probability (MiniMax-M1's CISPO, TRL's ``loss_type="cispo"``), a term per completion token.

The advantage estimators (``train.rl.advantage``) are GRPO's group mean, RLOO's leave-one-out mean, and
REINFORCE++ (the reward whitened over the batch's tokens) with its baseline variant (less the group mean
first), as OpenRLHF and verl define them.

The formulas are TRL's ``GRPOTrainer`` and ``RLOOTrainer``'s where TRL has them (tests compare them on the
same inputs), else the papers' (tests compare a float64 computation). The objectives and the advantage
estimators sit in registries (:data:`POLICY_LOSSES`, :data:`BASELINES`), each registered by decorator beside
its formula: adding one touches this file (and the config's list of names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from rayft.data.prepared import IGNORE_INDEX
from rayft.training.loop.targets import kept_positions as kept_positions  # noqa: PLC0414 - re-exported for rl's modules
from rayft.training.loop.targets import target_scores
from rayft.training.methods.unit import Registry

if TYPE_CHECKING:
    import torch

    from rayft.data.collate import MicroBatch

RlLoss = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo"]
Baseline = Literal["group", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
Scale = Literal["group", "batch", "none"]
STD_EPS = 1e-4  # TRL's: a group whose rewards are all equal gets advantage 0, not a division by 0
WHITEN_EPS = 1e-8  # OpenRLHF's and verl's masked_whiten: added to the variance under the square root


class BaselineFn(Protocol):
    """An advantage estimator: each completion's advantage from the rewards ``grouped`` as ``(prompts,
    group_size)``, the completions' token counts ``lengths`` (same shape) and ``train.rl.scale_rewards``."""

    def __call__(self, grouped: torch.Tensor, lengths: torch.Tensor, scale: Scale) -> torch.Tensor: ...


class Surrogate(Protocol):
    """An objective's per-token loss before normalisation, ``(rows, positions)`` or ``(rows, 1)`` for one
    value per completion, with the masks of the tokens it clipped below and above (for the figures)."""

    def __call__(
        self, logps: torch.Tensor, old_logps: torch.Tensor, column: torch.Tensor, mask: torch.Tensor,
        settings: PolicyLossSettings,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...  # fmt: skip


class LossTerms(Protocol):
    """A loss variant: the sum of a micro-batch's loss terms and their count, from each row's sum of
    (masked) per-token losses ``token_sums``, the completion-token ``weights`` and ``mask``."""

    def __call__(
        self, token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
    ) -> tuple[torch.Tensor, int]: ...


@dataclass(frozen=True)
class PolicyObjective:
    """One ``train.rl.loss``: its per-token surrogate, how its loss terms are summed and counted, and whether
    a term is a completion token (else a completion)."""

    surrogate: Surrogate
    terms: LossTerms
    token_terms: bool


BASELINES: Registry[BaselineFn] = Registry("train.rl.advantage")
POLICY_LOSSES: Registry[PolicyObjective] = Registry("train.rl.loss")


def scaled(advantages: torch.Tensor, grouped: torch.Tensor, scale: Scale) -> torch.Tensor:
    """``advantages`` divided by the group's or the batch's reward standard deviation (TRL's), or as they are."""
    if scale == "group":
        return advantages / (unbiased_std(grouped, dim=1).unsqueeze(1) + STD_EPS)
    if scale == "batch":
        return advantages / (unbiased_std(grouped.reshape(-1)) + STD_EPS)
    return advantages


def token_whitened(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``values`` (one per completion, the same on each of its tokens) whitened over every completion token of
    the batch: less the token mean, over the square root of the unbiased token variance plus 1e-8 (OpenRLHF's
    and verl's ``masked_whiten`` of a constant-per-row tensor: a longer completion weighs more)."""
    import torch

    weights = lengths.to(values.dtype)
    count = weights.sum()
    mean = (values * weights).sum() / count
    variance = ((values - mean) ** 2 * weights).sum() / count * (count / (count - 1))
    return (values - mean) * torch.rsqrt(variance + WHITEN_EPS)


@BASELINES.register("group")
def group_mean_baseline(grouped: torch.Tensor, lengths: torch.Tensor, scale: Scale) -> torch.Tensor:
    """GRPO's: less the group's mean reward, then ``scale``."""
    return scaled(grouped - grouped.mean(dim=1, keepdim=True), grouped, scale)


@BASELINES.register("rloo")
def leave_one_out_baseline(grouped: torch.Tensor, lengths: torch.Tensor, scale: Scale) -> torch.Tensor:
    """RLOO's: less the mean reward of the group's other completions, then ``scale``."""
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (grouped.shape[1] - 1)
    return scaled(grouped - others, grouped, scale)


@BASELINES.register("reinforce_pp")
def reinforce_pp(grouped: torch.Tensor, lengths: torch.Tensor, scale: Scale) -> torch.Tensor:
    """REINFORCE++: the outcome reward (every token's undiscounted return) whitened over the batch's tokens;
    no group baseline, and ``scale`` unread (the whitening is the normalisation)."""
    return token_whitened(grouped.reshape(-1), lengths.reshape(-1)).view_as(grouped)


@BASELINES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(grouped: torch.Tensor, lengths: torch.Tensor, scale: Scale) -> torch.Tensor:
    """REINFORCE++-baseline: less the group's mean reward, then whitened over the batch's tokens (``scale``
    unread)."""
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return token_whitened(centred.reshape(-1), lengths.reshape(-1)).view_as(grouped)


def unbiased_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The standard deviation with Bessel's correction (as TRL's ``nanstd``)."""
    if dim is None:
        return values.std(unbiased=True) if values.numel() > 1 else values.new_zeros(())
    return values.std(dim=dim, unbiased=True)


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, baseline: Baseline, scale: Scale, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """Each completion's advantage under the estimator ``baseline`` (:data:`BASELINES`): for 'group' and
    'rloo' its reward less its group's baseline, divided by the group's or the batch's reward standard
    deviation unless ``scale`` is 'none'; REINFORCE++'s whiten over the completions' tokens (``lengths``, one
    per completion; unset: 1 each). ``rewards`` holds ``group_size`` consecutive completions per prompt."""
    import torch

    grouped = rewards.view(-1, group_size)
    counts = torch.ones_like(rewards) if lengths is None else lengths
    return BASELINES[baseline](grouped, counts.view(-1, group_size), scale).reshape(-1)


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
    projection); ``(rows, kept positions)`` each, the kept positions those of :func:`kept_positions`. Rows
    that carry their packed form run the forward on it (:func:`rayft.training.loop.targets.target_scores`)."""
    (logps, entropy), kept = target_scores(model, rows, autocast_dtype, token_logps_and_entropy)
    return logps, entropy, kept != IGNORE_INDEX


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
    """The objective ``settings.loss`` per completion token (GRPO's clipped surrogate ``-min(r A, clip(r, 1 -
    eps_low, 1 + eps_high) A)``, ``r`` the probability ratio to the sampling policy's ``old_logps``; or another
    of :data:`POLICY_LOSSES`), plus ``kl_coef`` times the k3 estimate of the KL divergence to ``ref_logps``,
    summed into its loss terms. Every tensor but ``advantages`` (one per row) is ``(rows, positions)``; ``mask``
    marks completion tokens; ``token_weights`` (:func:`importance_weights`, for stale rollouts) scale each
    token's objective term."""
    import torch

    objective = POLICY_LOSSES[settings.loss]
    weights = mask.to(logps.dtype)
    column = advantages.unsqueeze(1)
    per_token, low, high = objective.surrogate(logps, old_logps, column, mask, settings)
    per_token = per_token.expand_as(logps)
    if token_weights is not None:
        per_token = per_token * token_weights
    kl_sum = 0.0
    if ref_logps is not None and settings.kl_coef != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        per_token = per_token + settings.kl_coef * kl
        kl_sum = float((kl.detach() * weights).sum())
    token_sums = (per_token * weights).sum(-1)
    loss_sum, terms = objective.terms(token_sums, weights, mask, settings)
    with torch.no_grad():
        low_count, high_count = (low.expand_as(mask) & mask).sum(), (high.expand_as(mask) & mask).sum()
    return PolicyLoss(loss_sum, terms, float(weights.sum()), kl_sum, float(low_count), float(high_count))


def clipped_surrogate(
    ratio: torch.Tensor, column: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` and where the clip bit, below and above."""
    import torch

    clipped = torch.clamp(ratio, 1 - settings.epsilon_low, 1 + settings.epsilon_high)
    per_token = -torch.min(ratio * column, clipped * column)
    with torch.no_grad():
        low = (ratio < 1 - settings.epsilon_low) & (column < 0)
        high = (ratio > 1 + settings.epsilon_high) & (column > 0)
    return per_token, low, high


def token_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, column: torch.Tensor, mask: torch.Tensor,
    settings: PolicyLossSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The clipped surrogate with one ratio per token (PPO, GRPO, DAPO)."""
    import torch

    return clipped_surrogate(torch.exp(logps - old_logps), column, settings)


def sequence_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, column: torch.Tensor, mask: torch.Tensor,
    settings: PolicyLossSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """GSPO's: the clipped surrogate with one ratio per completion, ``exp`` of its tokens' mean log-ratio
    (the geometric mean of their ratios), ``(rows, 1)``."""
    import torch

    weights = mask.to(logps.dtype)
    log_ratio = ((logps - old_logps) * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)
    return clipped_surrogate(torch.exp(log_ratio).unsqueeze(-1), column, settings)


def clipped_weight(
    logps: torch.Tensor, old_logps: torch.Tensor, column: torch.Tensor, mask: torch.Tensor,
    settings: PolicyLossSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """CISPO's ``-sg(min(r, 1 + eps_high)) A log pi``: the importance weight is clipped (above only) and
    carries no gradient, so every token keeps its policy gradient, however far its ratio went."""
    import torch

    ratio = torch.exp(logps - old_logps)
    cap = 1 + settings.epsilon_high
    per_token = -torch.clamp(ratio, max=cap).detach() * column * logps
    with torch.no_grad():
        high = (ratio > cap) & (column > 0)
    return per_token, torch.zeros_like(high), high


def objective(name: str, surrogate: Surrogate, *, token_terms: bool) -> Callable[[LossTerms], LossTerms]:
    """A decorator that registers ``name`` in :data:`POLICY_LOSSES`: ``surrogate`` with the decorated terms."""

    def add(terms: LossTerms) -> LossTerms:
        POLICY_LOSSES.register(name)(PolicyObjective(surrogate, terms, token_terms))
        return terms

    return add


@objective("grpo", token_ratio, token_terms=False)
def completion_mean_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """GRPO (DeepSeekMath): a term is a completion, worth its mean token loss."""
    return (token_sums / weights.sum(-1).clamp(min=1.0)).sum(), int(mask.shape[0])


@objective("dr_grpo", token_ratio, token_terms=False)
def fixed_length_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """Dr. GRPO: a term is a completion, worth its token-loss sum over ``max_new_tokens``."""
    return token_sums.sum() / settings.max_new_tokens, int(mask.shape[0])


@objective("dapo", token_ratio, token_terms=True)
def token_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """DAPO: a term is a completion token (the token-level mean)."""
    return token_sums.sum(), int(mask.sum())


@objective("gspo", sequence_ratio, token_terms=False)
def sequence_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """GSPO: a term is a completion, worth its (sequence-level) loss: GRPO's completion mean."""
    return completion_mean_terms(token_sums, weights, mask, settings)


@objective("cispo", clipped_weight, token_terms=True)
def cispo_terms(
    token_sums: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, settings: PolicyLossSettings
) -> tuple[torch.Tensor, int]:
    """CISPO: a term is a completion token (the token-level mean, as TRL's)."""
    return token_terms(token_sums, weights, mask, settings)
