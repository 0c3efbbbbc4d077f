"""The GRPO losses against TRL's ``GRPOTrainer`` as the oracle, on random log-probabilities.

TRL computes its loss in ``GRPOTrainer._compute_loss``, bound to a trainer; the tests call it with the few
attributes it reads and a stand-in for its per-token log-probability pass that returns the same random
values rayft's loss gets, so every formula (clipping, KL, each loss type's normalisation) is TRL's own.
Losses and their gradients must agree.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rayft.training.methods.rl.losses import (  # noqa: E402
    PolicyLossSettings,
    group_advantages,
    importance_weights,
    policy_loss,
    token_logps_and_entropy,
)

# Two computations of one quantity compared within a bound: run under every CPU kernel path by
# scripts/test_kernels.py (`make test-kernels`).
pytestmark = pytest.mark.numerics

ROWS, LENGTH, MAX_NEW = 6, 9, 12
FP32_U = 2.0**-24  # float32's unit roundoff: an operation's result is within a relative 2**-24 of exact


def _sum_error_bound(data: dict[str, torch.Tensor], ratio: torch.Tensor, beta: float) -> float:
    """How far two float32 evaluations of the loss (a normalised sum of per-token terms, in any order and
    with any vector width) may lie apart: each term (an exp, a product, a clip) is within a few roundings of
    exact, and a sum of n terms within (n - 1) * u * (sum of their magnitudes) (Higham's bound); divided by
    the normaliser (at least 1) that is at most ~2u * sum |term| for each evaluation, 4u for the two. The
    loss itself may be near 0 (group advantages cancel), so a relative bound alone would ask for more than
    float32 can give; a formula error moves the loss by far more (1e-3 and up)."""
    column = data["advantages"].abs().unsqueeze(1)
    kl = torch.exp(data["ref"] - data["logps"]) - (data["ref"] - data["logps"]) - 1
    magnitudes = (column * ratio.clamp(min=1.0) * 1.28 + beta * kl.abs()) * data["mask"]
    return 4 * FP32_U * float(magnitudes.sum())


def _inputs(seed: int, *, kl: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(ROWS, LENGTH, dtype=torch.long)
    for row in range(ROWS):  # completions of different lengths, one of them empty
        mask[row, : int(torch.randint(0 if row == 0 else 1, LENGTH + 1, (1,), generator=generator))] = 1
    return {
        "logps": -3 * torch.rand(ROWS, LENGTH, generator=generator),
        "ref": -3 * torch.rand(ROWS, LENGTH, generator=generator) if kl else torch.zeros(ROWS, LENGTH),
        "advantages": torch.randn(ROWS, generator=generator),
        "mask": mask,
    }


def _trl_loss(data: dict[str, torch.Tensor], logps: torch.Tensor, *, loss_type: str, beta: float,
              eps_low: float, eps_high: float, level: str = "token",
              old: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """TRL's ``GRPOTrainer._compute_loss`` (one process, no accumulation) with ``logps`` as the policy's
    per-token log-probabilities of the completions (``old``: the sampling policy's, when not these;
    ``level``: TRL's ``importance_sampling_level``)."""
    from trl import GRPOTrainer

    def per_token(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, **_: Any) -> Any:
        return logps, torch.zeros_like(logps), None

    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list)}
    accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                  reduce=lambda x, reduction: x)  # fmt: skip
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=False,
        aux_loss_enabled=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW,
        accelerator=accelerator,
        _metrics=metrics,
        _entropy_bonus_enabled=False,
    )
    mask = data["mask"]
    inputs = {
        "prompt_ids": torch.zeros(ROWS, 2, dtype=torch.long), "prompt_mask": torch.ones(ROWS, 2, dtype=torch.long),
        "completion_ids": torch.zeros(ROWS, LENGTH, dtype=torch.long), "completion_mask": mask,
        "advantages": data["advantages"], "ref_per_token_logps": data["ref"], "num_items_in_batch": mask.sum(),
    }  # fmt: skip
    if old is not None:
        inputs["old_per_token_logps"] = old
    return GRPOTrainer._compute_loss(trainer, None, inputs)  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_policy_loss_and_gradient_equal_trls(seed: int, loss_type: str, beta: float) -> None:
    data = _inputs(seed, kl=beta > 0)
    eps_high = 0.28 if loss_type == "dapo" else 0.2  # DAPO's clip-higher
    ours_logps = data["logps"].clone().requires_grad_(True)
    settings = PolicyLossSettings(loss_type, 0.2, eps_high, beta, MAX_NEW)  # type: ignore[arg-type]
    result = policy_loss(ours_logps, ours_logps.detach(), data["ref"] if beta else None, data["advantages"],
                         data["mask"].bool(), settings)  # fmt: skip
    ours = result.loss_sum / max(result.terms, 1)
    ours.backward()

    trl_logps = data["logps"].clone().requires_grad_(True)
    trl = _trl_loss(data, trl_logps, loss_type=loss_type, beta=beta, eps_low=0.2, eps_high=eps_high)
    trl.backward()
    bound = _sum_error_bound(data, torch.ones(()), beta)
    assert float(ours.detach()) == pytest.approx(float(trl.detach()), rel=1e-6, abs=bound)
    assert ours_logps.grad is not None and trl_logps.grad is not None
    # A token's gradient is its own term's derivative over the normaliser: no sum, a few roundings each
    # (1e-5 = 168u of the entry); masked tokens' gradients are 0 on both sides.
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad, rtol=1e-5, atol=1e-7)
    assert result.terms == (int(data["mask"].sum()) if loss_type == "dapo" else ROWS)


def test_clipping_with_stale_samples_equals_trls() -> None:
    """With a sampling policy that differs from the current one (``old`` log-probabilities), the clipped
    surrogate is TRL's (its ``old_per_token_logps`` input), both clip ranges in play."""
    from trl import GRPOTrainer

    data = _inputs(3, kl=False)
    old = data["logps"] + 0.5 * torch.randn(ROWS, LENGTH, generator=torch.Generator().manual_seed(9))
    logps = data["logps"].clone().requires_grad_(True)
    result = policy_loss(logps, old, None, data["advantages"], data["mask"].bool(),
                         PolicyLossSettings("grpo", 0.2, 0.28, 0.0, MAX_NEW))  # fmt: skip
    assert result.low_clipped + result.high_clipped > 0

    trl_logps = data["logps"].clone().requires_grad_(True)
    original = GRPOTrainer._compute_loss

    def with_old(trainer: Any, model: Any, inputs: dict[str, Any]) -> Any:
        return original(trainer, model, {**inputs, "old_per_token_logps": old})

    trl = _trl_loss_with(with_old, data, trl_logps)
    bound = _sum_error_bound(data, torch.exp(data["logps"] - old), 0.0)
    assert float(result.loss_sum.detach() / result.terms) == pytest.approx(float(trl.detach()), rel=1e-6, abs=bound)


def test_recorded_rollout_logps_give_ratio_one_on_the_first_update() -> None:
    """steps_per_rollout > 1 records the rollout policy's log-probabilities; the first update's policy is
    that policy, so its loss and gradient are the on-policy ones (ratio 1, nothing clipped)."""
    data = _inputs(4, kl=False)
    settings = PolicyLossSettings("dapo", 0.2, 0.28, 0.0, MAX_NEW)
    recorded = data["logps"].clone()
    first = data["logps"].clone().requires_grad_(True)
    on_policy = data["logps"].clone().requires_grad_(True)
    ours = policy_loss(first, recorded, None, data["advantages"], data["mask"].bool(), settings)
    want = policy_loss(on_policy, on_policy.detach(), None, data["advantages"], data["mask"].bool(), settings)
    ours.loss_sum.backward()
    want.loss_sum.backward()
    assert (ours.low_clipped, ours.high_clipped) == (0.0, 0.0)
    assert float(ours.loss_sum.detach()) == float(want.loss_sum.detach())
    assert first.grad is not None and on_policy.grad is not None
    torch.testing.assert_close(first.grad, on_policy.grad, rtol=0, atol=0)


def _trl_loss_with(compute: Any, data: dict[str, torch.Tensor], logps: torch.Tensor) -> torch.Tensor:
    from trl import GRPOTrainer

    saved = GRPOTrainer._compute_loss
    GRPOTrainer._compute_loss = compute  # type: ignore[method-assign]
    try:
        return _trl_loss(data, logps, loss_type="grpo", beta=0.0, eps_low=0.2, eps_high=0.28)
    finally:
        GRPOTrainer._compute_loss = saved  # type: ignore[method-assign]


def test_group_advantages_are_trls_grpo_and_rloo_formulas() -> None:
    """GRPO: (r - group mean) / (group std + 1e-4), TRL's unbiased ``nanstd``; RLOO: r less the mean of the
    group's other rewards; a group whose rewards are all equal gets 0."""
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 2.0])
    grouped = rewards.view(-1, 4)
    mean = grouped.mean(1).repeat_interleave(4)
    std = nanstd(grouped, dim=1).repeat_interleave(4)
    torch.testing.assert_close(group_advantages(rewards, 4, baseline="group", scale="group"),
                               (rewards - mean) / (std + 1e-4))  # fmt: skip
    torch.testing.assert_close(group_advantages(rewards, 4, baseline="group", scale="none"), rewards - mean)
    torch.testing.assert_close(group_advantages(rewards, 4, baseline="group", scale="batch"),
                               (rewards - mean) / (nanstd(rewards) + 1e-4))  # fmt: skip
    loo = (grouped.sum(1, keepdim=True) - grouped) / 3
    torch.testing.assert_close(group_advantages(rewards, 4, baseline="rloo", scale="none"),
                               (grouped - loo).reshape(-1))  # fmt: skip
    assert group_advantages(rewards, 4, baseline="group", scale="group")[4:8].abs().max() == 0


def test_token_logps_and_entropy_of_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator)
    targets = torch.randint(0, 11, (3, 5), generator=generator)
    targets[0, :2] = -100
    logps, entropy = token_logps_and_entropy(logits, targets)
    want = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    torch.testing.assert_close(logps, want * (targets != -100))
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1) * (targets != -100))
    assert logps[0, :2].abs().sum() == 0


def test_importance_weights_truncate_the_ratio_to_the_sampling_policy_and_leave_padding_at_one() -> None:
    proximal = torch.log(torch.tensor([[0.5, 0.4, 0.2], [0.3, 0.3, 0.3]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.4, 0.8], [0.05, 0.3, 0.9]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    weights = importance_weights(proximal, behaviour, mask, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0, 0.25], [2.0, 1.0, 1.0]]))
    assert not weights.requires_grad


def test_weighted_tokens_scale_the_clipped_surrogate_and_not_the_kl_term() -> None:
    """A stale rollout's loss: each token's clipped surrogate times its importance weight, the KL penalty
    as it is (decoupled PPO's objective with truncated weights)."""
    data = _inputs(5, kl=True)
    mask = data["mask"].bool()
    settings = PolicyLossSettings("dapo", 0.2, 0.28, 0.1, MAX_NEW)
    old = data["logps"] + 0.3 * torch.randn(ROWS, LENGTH, generator=torch.Generator().manual_seed(2))
    weights = importance_weights(old, old - 0.4 * torch.rand(ROWS, LENGTH), mask, cap=2.0)
    logps = data["logps"].clone().requires_grad_(True)
    got = policy_loss(logps, old, data["ref"], data["advantages"], mask, settings, weights)

    ratio = torch.exp(data["logps"] - old)
    column = data["advantages"].unsqueeze(1)
    surrogate = -torch.min(ratio * column, torch.clamp(ratio, 0.8, 1.28) * column)
    kl = torch.exp(data["ref"] - data["logps"]) - (data["ref"] - data["logps"]) - 1
    want = ((weights * surrogate + 0.1 * kl) * mask).sum()
    bound = _sum_error_bound(data, weights * ratio, 0.1)
    assert float(got.loss_sum.detach()) == pytest.approx(float(want), rel=1e-6, abs=bound)
    unweighted = policy_loss(logps, old, data["ref"], data["advantages"], mask, settings)
    assert float(unweighted.loss_sum.detach()) != pytest.approx(float(want), rel=1e-3)


def test_the_samplers_completion_logps_are_the_trainers_token_for_token(tiny_model_dir: Any) -> None:
    """What a generation actor reports of its samples is what the trainer computes of the same rows with
    the same weights: the importance weight of a fresh rollout is 1."""
    from transformers import AutoModelForCausalLM

    from rayft.config.model import ModelConfig
    from rayft.config.rl import RlConfig
    from rayft.data.collate import collate
    from rayft.data.prepared import IGNORE_INDEX
    from rayft.models.loading import load_tokenizer
    from rayft.training.methods.rl.losses import completion_logps
    from rayft.training.methods.rl.sampling import Sampler

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    sampler = Sampler(RlConfig(rewards=[{"function": "exact_match"}]), tokenizer, "sdpa")
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    completions = [[20, 21, 22], [23], [24, 25, 26, 27, 28]]
    got = sampler.completion_logps(model, prompts, completions, rows_per_forward=2)

    units = [{"input_ids": p + c, "labels": [IGNORE_INDEX] * len(p) + c, "position_ids": range(len(p) + len(c)),
              "sample_ids": []} for p, c in zip(prompts, completions, strict=True)]  # fmt: skip
    with torch.no_grad():
        logps, _, mask = completion_logps(model, collate(units, 0), None)
    want = [row[m].tolist() for row, m in zip(logps, mask, strict=True)]
    assert [len(g) for g in got] == [3, 1, 5]
    for mine, theirs in zip(got, want, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
