"""The objectives and advantage estimators beyond GRPO's: GSPO and CISPO against TRL's ``GRPOTrainer`` as the
oracle (its own loss code, on the same log-probabilities, advantages and masks), REINFORCE++ and its baseline
variant against a float64 computation of their published definition (TRL has neither), and the overlong
shaping against a direct computation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from rayft.training.methods.rl.losses import (  # noqa: E402
    POLICY_LOSSES,
    PolicyLossSettings,
    group_advantages,
    policy_loss,
)
from rayft.training.methods.rl.overlong import overlong_penalty, shaped_rewards, truncated  # noqa: E402
from tests.unit.test_rl_losses import LENGTH, MAX_NEW, ROWS, _inputs, _sum_error_bound, _trl_loss  # noqa: E402

pytestmark = pytest.mark.numerics


def _stale(data: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    """Sampling-policy log-probabilities away from the current ones, so that ratios differ from 1 and both
    clip ranges bite (on-policy, every ratio is 1 and the objectives coincide)."""
    return data["logps"] + 0.4 * torch.randn(ROWS, LENGTH, generator=torch.Generator().manual_seed(seed))


def _ours(data: dict[str, torch.Tensor], old: torch.Tensor, settings: PolicyLossSettings) -> tuple[torch.Tensor, ...]:
    logps = data["logps"].clone().requires_grad_(True)
    result = policy_loss(logps, old, data["ref"] if settings.kl_coef else None, data["advantages"],
                         data["mask"].bool(), settings)  # fmt: skip
    loss = result.loss_sum / max(result.terms, 1)
    loss.backward()
    assert logps.grad is not None
    return loss.detach(), logps.grad, torch.tensor(result.high_clipped)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_gspo_equals_trls_sequence_level_importance_sampling(seed: int, beta: float) -> None:
    """GSPO: TRL's loss_type 'grpo' with importance_sampling_level 'sequence', with GSPO's tiny clip ranges
    (3e-4, 4e-4: almost every sequence ratio is clipped) and with GRPO's (0.2, 0.28)."""
    data = _inputs(seed, kl=beta > 0)
    old = _stale(data, seed + 10)
    for low, high in ((3e-4, 4e-4), (0.2, 0.28)):
        loss, grad, _ = _ours(data, old, PolicyLossSettings("gspo", low, high, beta, MAX_NEW))
        trl_logps = data["logps"].clone().requires_grad_(True)
        trl = _trl_loss(data, trl_logps, loss_type="grpo", beta=beta, eps_low=low, eps_high=high, level="sequence",
                        old=old)  # fmt: skip
        trl.backward()
        # Sequence ratios are exp of a mean of log-ratios (up to ~1.5): the per-token bound with that ratio.
        bound = _sum_error_bound(data, torch.exp((data["logps"] - old).abs()), beta)
        assert float(loss) == pytest.approx(float(trl.detach()), rel=1e-6, abs=bound)
        assert trl_logps.grad is not None
        # One token's gradient: a ratio times the advantage over the completion's length and count, a few
        # roundings each (1e-5 is ~170 float32 units of the entry).
        torch.testing.assert_close(grad, trl_logps.grad, rtol=1e-5, atol=1e-7)


def test_gspo_is_not_grpo_off_policy() -> None:
    """The sequence-level ratio is a different objective from the token-level one once ratios differ from 1."""
    data = _inputs(3, kl=False)
    old = _stale(data, 4)
    gspo = _ours(data, old, PolicyLossSettings("gspo", 0.2, 0.28, 0.0, MAX_NEW))[0]
    grpo = _ours(data, old, PolicyLossSettings("grpo", 0.2, 0.28, 0.0, MAX_NEW))[0]
    assert float(gspo) != pytest.approx(float(grpo), rel=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_cispo_equals_trls(seed: int, beta: float) -> None:
    """CISPO: TRL's loss_type 'cispo', whose epsilon_high is the weight's cap itself (rayft's 1 + epsilon_high)."""
    data = _inputs(seed, kl=beta > 0)
    old = _stale(data, seed + 20)
    loss, grad, _ = _ours(data, old, PolicyLossSettings("cispo", 0.2, 0.28, beta, MAX_NEW))
    assert bool(((torch.exp(data["logps"] - old) > 1.28) & data["mask"].bool()).any())  # the cap is in play
    trl_logps = data["logps"].clone().requires_grad_(True)
    trl = _trl_loss(data, trl_logps, loss_type="cispo", beta=beta, eps_low=0.2, eps_high=1.28, old=old)
    trl.backward()
    # |term| = weight (<= 1.28) x |A| x |log p| (<= 3): the per-token bound with that factor.
    bound = _sum_error_bound(data, torch.full((), 3.0 * 1.28), beta)
    assert float(loss) == pytest.approx(float(trl.detach()), rel=1e-6, abs=bound)
    assert trl_logps.grad is not None
    torch.testing.assert_close(grad, trl_logps.grad, rtol=1e-5, atol=1e-7)
    assert POLICY_LOSSES["cispo"].token_terms and not POLICY_LOSSES["gspo"].token_terms


def test_cispo_keeps_the_gradient_of_tokens_grpo_clips() -> None:
    """Where GRPO's clipped surrogate has no gradient (a ratio past 1 + eps with a positive advantage), CISPO's
    token still has one: the capped weight times the advantage."""
    logps = torch.log(torch.tensor([[0.9, 0.5]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.3, 0.5]]))  # ratio 3 on the first token, 1 on the second
    mask = torch.tensor([[True, True]])
    advantages = torch.tensor([2.0])
    policy_loss(logps, old, None, advantages, mask, PolicyLossSettings("cispo", 0.2, 0.28)).loss_sum.backward()
    assert logps.grad is not None
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.28 * 2.0, -1.0 * 2.0]]))
    grpo = logps.detach().clone().requires_grad_(True)
    policy_loss(grpo, old, None, advantages, mask, PolicyLossSettings("dapo", 0.2, 0.28)).loss_sum.backward()
    assert grpo.grad is not None and float(grpo.grad[0, 0]) == 0.0


def _whitened64(values: list[float], lengths: list[int]) -> list[float]:
    """OpenRLHF's and verl's masked_whiten of a per-token tensor that holds each completion's value on each of
    its tokens, in float64, token by token as they compute it."""
    tokens = torch.tensor([v for v, n in zip(values, lengths, strict=True) for _ in range(n)], dtype=torch.float64)
    mean = tokens.mean()
    variance = ((tokens - mean) ** 2).mean() * tokens.numel() / (tokens.numel() - 1)
    return [float((v - mean) * torch.rsqrt(variance + 1e-8)) for v in values]


@pytest.mark.parametrize("baseline", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_advantages_equal_the_published_definition(baseline: str) -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 3, (12,), generator=generator).to(torch.float32) / 2
    lengths = torch.randint(1, 9, (12,), generator=generator)
    got = group_advantages(rewards, 4, baseline=baseline, scale="none", lengths=lengths.to(torch.float32))  # type: ignore[arg-type]
    values = rewards.double().view(-1, 4)
    if baseline == "reinforce_pp_baseline":
        values = values - values.mean(dim=1, keepdim=True)
    want = torch.tensor(_whitened64(values.reshape(-1).tolist(), lengths.tolist()), dtype=torch.float32)
    # A float32 whitening of 12 values of size <= 1 over <= 96 tokens: sums within 96u of exact, the
    # quotient by a standard deviation >= 0.2 within 1e-5 absolute.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The token-weighted mean of the advantages is 0 (the whitening's shift).
    assert abs(float((got * lengths).sum())) < 1e-4 * float(lengths.sum())


def test_reinforce_pp_baseline_is_not_plain_reinforce_pp() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    lengths = torch.ones(8)
    plain = group_advantages(rewards, 4, baseline="reinforce_pp", scale="none", lengths=lengths)
    based = group_advantages(rewards, 4, baseline="reinforce_pp_baseline", scale="none", lengths=lengths)
    assert not torch.allclose(plain, based)
    # With the baseline, a group's advantages sum to 0 before the shared whitening's shift and scale.
    assert float(based[:4].sum() + based[4:].sum()) == pytest.approx(0.0, abs=1e-5)


def test_overlong_penalty_is_dapos_linear_ramp() -> None:
    """0 up to max_new - buffer tokens, then falling by factor / buffer per token to -factor at max_new."""
    max_new, buffer, factor = 20, 8, 0.5
    for length in range(1, max_new + 1):
        want = 0.0 if length <= max_new - buffer else -factor * (length - (max_new - buffer)) / buffer
        assert overlong_penalty(length, max_new, buffer, factor) == pytest.approx(want, abs=1e-12)
    assert overlong_penalty(max_new, max_new, buffer, factor) == pytest.approx(-factor)
    ids = [[1] * 10, [1] * 16, [1] * 20]
    assert shaped_rewards([1.0, 1.0, 0.0], ids, max_new_tokens=max_new, buffer=buffer, factor=factor) == (
        pytest.approx([1.0, 1.0 - 0.5 * 4 / 8, -0.5])
    )
    assert shaped_rewards([1.0, 0.0, 0.0], ids, max_new_tokens=max_new, buffer=None, factor=factor) == [1.0, 0.0, 0.0]


def test_truncated_completions_are_those_without_an_end_of_sequence() -> None:
    assert truncated([[5, 6, 2], [5, 6, 7], [2], []], eos_ids=[2]) == [False, True, False, True]
