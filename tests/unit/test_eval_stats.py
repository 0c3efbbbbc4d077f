"""Intervals and paired tests on constructed cases with known answers."""

from __future__ import annotations

import math

import pytest

from rayft.evaluation import stats


def test_wilson_interval_known_values() -> None:
    low, high = stats.wilson_interval(8, 10, 0.95)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    low, high = stats.wilson_interval(0, 20, 0.95)
    assert low == pytest.approx(0.0, abs=1e-12)
    assert high == pytest.approx(0.16113, abs=1e-4)  # z^2 / (n + z^2)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (1, 6, 0.125),  # 2 * (1 + 7) / 2**7
        (0, 10, 2 / 1024),
        (2, 8, 0.109375),  # 2 * (1 + 10 + 45) / 2**10, as scipy.stats.binomtest(2, 10).pvalue
        (5, 5, 1.0),
        (0, 0, 1.0),
        (6, 1, 0.125),  # symmetric
    ],
)
def test_mcnemar_exact_p_values(b: int, c: int, p: float) -> None:
    assert stats.mcnemar_exact_p(b, c) == pytest.approx(p, rel=1e-12)


def test_mcnemar_uses_only_discordant_pairs() -> None:
    # 20 examples: 10 both right, 0 only A, 10 only B -> p = 2 / 2**10.
    a = [1.0] * 10 + [0.0] * 10
    b = [1.0] * 20
    test = stats.mcnemar_test(a, b)
    assert test.test == "mcnemar_exact"
    assert test.p_value == pytest.approx(2 / 1024)
    assert test.significant
    assert test.difference == pytest.approx(0.5)
    assert test.detail == {"only_a_correct": 0, "only_b_correct": 10, "both_correct": 10, "both_wrong": 0}
    # Wald interval of a paired difference: sqrt((b + c) - (c - b)^2 / n) / n = sqrt(10 - 5) / 20.
    half = 1.959964 * math.sqrt(5) / 20
    assert test.diff_ci_low == pytest.approx(0.5 - half, abs=1e-5)
    assert test.diff_ci_high == pytest.approx(0.5 + half, abs=1e-5)


def test_mcnemar_not_significant_when_models_agree() -> None:
    outcome = [1.0, 0.0, 1.0, 1.0]
    test = stats.mcnemar_test(outcome, outcome)
    assert test.p_value == 1.0
    assert not test.significant
    assert test.difference == 0.0


def test_paired_bootstrap_detects_a_constant_improvement() -> None:
    a = [0.1 * (i % 7) for i in range(50)]
    b = [x + 0.2 for x in a]
    test = stats.paired_bootstrap_test(a, b, samples=1000, seed=1)
    assert test.difference == pytest.approx(0.2)
    assert test.p_value == pytest.approx(1 / 1001)
    assert test.significant
    assert test.diff_ci_low == pytest.approx(0.2)
    assert test.diff_ci_high == pytest.approx(0.2)


def test_paired_bootstrap_finds_no_difference_in_noise() -> None:
    a = [float(i % 5) for i in range(40)]
    b = [float((i * 3) % 5) for i in range(40)]  # same values, shuffled: mean difference 0
    test = stats.paired_bootstrap_test(a, b, samples=500, seed=0)
    assert test.difference == pytest.approx(0.0)
    assert test.p_value == 1.0
    assert not test.significant
    assert test.diff_ci_low < 0 < test.diff_ci_high


def test_paired_bootstrap_is_reproducible_and_p_is_sane() -> None:
    a = [0.5, 0.6, 0.4, 0.7, 0.2, 0.9, 0.3, 0.5]
    b = [0.55, 0.6, 0.5, 0.65, 0.3, 0.95, 0.3, 0.6]
    first = stats.paired_bootstrap_test(a, b, samples=2000, seed=3)
    second = stats.paired_bootstrap_test(a, b, samples=2000, seed=3)
    assert first == second
    assert 0 < first.p_value < 0.05
    assert first.diff_ci_low > 0


def test_estimate_uses_wilson_for_binary_and_bootstrap_for_continuous() -> None:
    binary = stats.estimate([1.0] * 8 + [0.0] * 2, "binary")
    assert (binary.value, binary.n, binary.method) == (0.8, 10, "wilson")
    assert round(binary.ci_low, 4) == 0.4902
    continuous = stats.estimate([0.2, 0.4, 0.6, 0.8], "continuous", samples=500)
    assert continuous.value == pytest.approx(0.5)
    assert continuous.method == "bootstrap"
    assert 0.2 <= continuous.ci_low < 0.5 < continuous.ci_high <= 0.8


def test_paired_tests_refuse_unpaired_scores() -> None:
    with pytest.raises(ValueError, match="same examples: got 2 and 3"):
        stats.paired_test("binary", [1.0, 0.0], [1.0, 0.0, 1.0])
