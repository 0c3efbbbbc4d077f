"""On-policy distillation's numbers and settings: the distillation term of every loss variant equals a float64
computation from the logits (value and gradient), its expected gradient over the student's samples is the
gradient of the exact reverse KL to the teacher, the config's refusals, and a teacher with another tokenizer
refused by name."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError
from rayft.training.methods.rl.losses import PolicyLossSettings, token_logps_and_entropy

GRPO = ("train.objective=grpo", "data.packing=false")
MAX_NEW = 6


def batch(seed: int) -> tuple[Any, Any, Any]:
    """Student and teacher logits ``(3 rows, 6 positions, 11 tokens)`` and targets, -100 off the completions
    (rows of 5, 3 and 1 completion tokens)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(3, MAX_NEW, 11, generator=generator, dtype=torch.float64)
    teacher = torch.randn(3, MAX_NEW, 11, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, MAX_NEW), generator=generator)
    targets[0, 5:] = -100
    targets[1, :2], targets[1, 5:] = -100, -100
    targets[2, :5] = -100
    return student, teacher, targets


def reference(student: Any, teacher: Any, targets: Any, loss: str, coefficient: float) -> tuple[float, Any]:
    """The term and its gradient in the student's logits, in float64 from the formulas: per sampled token
    ``c (log p_s - log p_t)``, normalised as ``loss``'s terms; its gradient ``c (log p_s - log p_t) (onehot(y) -
    softmax(z))`` (the score function of log-softmax), times the token's normalisation weight."""
    import torch

    mask = targets != -100
    safe = targets.masked_fill(~mask, 0)
    log_s = torch.log_softmax(student, -1)
    gap = (log_s.gather(-1, safe[..., None]) - torch.log_softmax(teacher, -1).gather(-1, safe[..., None]))[..., 0]
    gap = gap * mask
    per_row = mask.sum(-1, keepdim=True).to(torch.float64)
    norm = {"dapo": torch.ones_like(gap), "cispo": torch.ones_like(gap), "grpo": 1 / per_row.expand_as(gap),
            "gspo": 1 / per_row.expand_as(gap), "dr_grpo": torch.full_like(gap, 1 / MAX_NEW)}[loss]  # fmt: skip
    value = float((coefficient * gap * norm).sum())
    onehot = torch.nn.functional.one_hot(safe, student.shape[-1]).to(torch.float64)
    grad = (coefficient * gap * norm)[..., None] * (onehot - log_s.exp()) * mask[..., None]
    return value, grad


@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo", "gspo", "cispo"])
def test_the_distillation_term_equals_a_float64_computation_from_the_logits(loss: str) -> None:
    import torch

    from rayft.training.methods.rl.distill import distillation_loss

    student64, teacher64, targets = batch(seed=3)
    student = student64.float().requires_grad_(True)
    logps, _ = token_logps_and_entropy(student, targets)
    teacher_logps, _ = token_logps_and_entropy(teacher64.float(), targets)
    mask = targets != -100
    settings = PolicyLossSettings(loss=loss, epsilon_high=4.0 if loss == "cispo" else 0.2, max_new_tokens=MAX_NEW)
    result = distillation_loss(logps, logps.detach(), teacher_logps, mask, settings, 0.5)
    result.loss_sum.backward()
    want, want_grad = reference(student64, teacher64, targets, loss, 0.5)
    # float32 log-softmax over 11 logits of magnitude ~3: each log-probability within ~1e-6, and a sum of 9
    # token terms within ~1e-5; the gradients are single products of such values.
    assert float(result.loss_sum.detach()) == pytest.approx(want, abs=1e-5)
    assert student.grad is not None
    assert torch.allclose(student.grad.double(), want_grad, atol=1e-6)
    gap = (logps.detach().double() - teacher_logps.double()) * mask
    assert result.reverse_kl_sum == pytest.approx(float(gap.sum()), abs=1e-5)
    assert result.tokens == 9.0


def test_its_expected_gradient_over_the_students_samples_is_the_exact_reverse_kls() -> None:
    """At one position: ``sum_y p_s(y) grad term(y) = grad KL(p_s || p_t)``, all in float64 (the estimator is
    unbiased; a direct loss ``log p_s(y) - log p_t(y)`` would average to a zero gradient)."""
    import torch

    from rayft.training.methods.rl.distill import distillation_loss

    generator = torch.Generator().manual_seed(7)
    student = torch.randn(13, generator=generator, dtype=torch.float64)
    teacher = torch.randn(13, generator=generator, dtype=torch.float64)
    settings = PolicyLossSettings(loss="dapo")
    expected = torch.zeros_like(student)
    probs = torch.softmax(student, -1)
    for token in range(13):
        z = student.clone().requires_grad_(True)
        logps = torch.log_softmax(z, -1)[token].reshape(1, 1)
        teacher_logps = torch.log_softmax(teacher, -1)[token].reshape(1, 1)
        term = distillation_loss(
            logps, logps.detach(), teacher_logps, torch.ones(1, 1, dtype=torch.bool), settings, 1.0
        )
        (grad,) = torch.autograd.grad(term.loss_sum, z)
        expected += probs[token] * grad
    z = student.clone().requires_grad_(True)
    p, log_p, log_q = torch.softmax(z, -1), torch.log_softmax(z, -1), torch.log_softmax(teacher, -1)
    (exact,) = torch.autograd.grad((p * (log_p - log_q)).sum(), z)
    assert torch.allclose(expected, exact, atol=1e-12)  # float64 sums of 13 terms of magnitude ~1


def test_a_stale_rollouts_term_is_clipped_and_weighed_as_the_policy_loss_is() -> None:
    """With the rollout policy's log-probabilities apart from the current ones, the ratio is clipped: a token
    whose ratio left [1 - eps, 1 + eps] in the advantage's direction carries no gradient."""
    import torch

    from rayft.training.methods.rl.distill import distillation_loss

    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    teacher = torch.tensor([[-0.5, -0.5]], dtype=torch.float64)  # the teacher likes both tokens more: A > 0
    logps = torch.tensor([[-1.0 + 0.5, -1.0 + 0.05]], dtype=torch.float64, requires_grad=True)  # ratios 1.65, 1.05
    settings = PolicyLossSettings(loss="dapo", epsilon_low=0.2, epsilon_high=0.2)
    result = distillation_loss(logps, old, teacher, torch.ones(1, 2, dtype=torch.bool), settings, 1.0,
                               torch.tensor([[1.0, 0.5]], dtype=torch.float64))  # fmt: skip
    result.loss_sum.backward()
    assert logps.grad is not None
    assert logps.grad[0, 0] == 0.0  # clipped at 1.2
    assert float(logps.grad[0, 1]) == pytest.approx(-0.5 * 0.5 * math.exp(0.05), rel=1e-12)
    assert result.reverse_kl_sum == pytest.approx(-1.0)  # the gap at the rollout policy: 2 x (-1 - -0.5)


def test_distillation_loads_and_replace_lets_the_rewards_be_empty() -> None:
    cfg = load_config(None, [*GRPO, "train.rl.distillation={teacher: /models/teacher}", "train.rl.rewards=[]"])
    distillation = cfg.train.rl.distillation
    assert distillation is not None and (distillation.mode, distillation.coefficient) == ("replace", 1.0)
    assert cfg.train.rl.rewards == []
    added = load_config(None, [*GRPO, "train.rl.distillation={teacher: t, mode: add, coefficient: 0.1, "
                                      "endpoint: {base_url: 'http://127.0.0.1:9/v1'}}"])  # fmt: skip
    assert added.train.rl.distillation is not None and added.train.rl.distillation.endpoint is not None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.rl.rewards=[]"], r"train\.rl\.rewards is empty; name at least one reward function, or set"),
        (["train.rl.distillation={teacher: t, mode: add}", "train.rl.rewards=[]"], r"train\.rl\.rewards is empty"),
        (["train.rl.distillation={teacher: t}", "train.rl.dynamic_sampling={}"], r"unset dynamic_sampling or set"),
        (["train.rl.distillation={teacher: t, temperature: 1}"], r"distillation\.temperature: unknown key"),
        (["train.rl.distillation={teacher: t, coefficient: 0}"], r"distillation\.coefficient"),
        (["train.rl.distillation={coefficient: 1}"], r"distillation\.teacher"),
    ],
)
def test_distillation_settings_that_cannot_work_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(None, [*GRPO, *overrides])
    assert caught.value.args[0].count("\n") <= 1  # the header and the problem


def test_a_teacher_with_another_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rayft.testing import build_tiny_tokenizer
    from rayft.training.methods.rl.distill import check_same_tokenizer

    student = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "student"))
    same = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "same"))
    other = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "other", vocab_size=300))
    check_same_tokenizer(same, student, ("same", "student"))  # one vocabulary: accepted
    refusal = r"train\.rl\.distillation\.teacher: 'other' has another tokenizer than model\.name 'student' \(\d+ and "
    with pytest.raises(ConfigError, match=refusal + r"\d+ tokens; .* distil from a teacher that shares"):
        check_same_tokenizer(other, student, ("other", "student"))
