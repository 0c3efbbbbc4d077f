"""Intervals and paired tests on constructed cases with known answers."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
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
    # Clopper-Pearson for 10/10 discordant pairs going B's way: [0.025 ** (1/10), 1], times m/n = 1/2.
    assert test.diff_ci_low == pytest.approx(0.5 * (2 * 0.025 ** (1 / 10) - 1), abs=1e-9)
    assert test.diff_ci_high == pytest.approx(0.5)


def test_mcnemar_interval_does_not_contradict_the_test_on_a_small_improvement() -> None:
    # 80 examples, B alone right on 5, A alone right on none: p = 2 / 2**5 = 0.0625, not significant,
    # so the interval must contain 0 (a Wald interval gave [+0.0095, +0.1155]).
    a = [0.0] * 5 + [1.0] * 40 + [0.0] * 35
    b = [1.0] * 5 + [1.0] * 40 + [0.0] * 35
    test = stats.mcnemar_test(a, b)
    assert test.p_value == pytest.approx(0.0625)
    assert not test.significant
    # Clopper-Pearson of 5/5 is [0.025 ** (1/5), 1] = [0.478176, 1]; scaled by m/n = 5/80.
    assert test.diff_ci_low == pytest.approx(5 / 80 * (2 * 0.025 ** (1 / 5) - 1), abs=1e-9)
    assert test.diff_ci_low < 0 < test.diff_ci_high == pytest.approx(5 / 80)


def test_exact_conditional_interval_matches_clopper_pearson() -> None:
    # Clopper-Pearson of 2/10 and 30/50 at 95% (as scipy.stats.binomtest(...).proportion_ci("exact")).
    low, high = stats.exact_conditional_interval(8, 2, 10, 0.05)
    assert (low, high) == pytest.approx((2 * 0.025210726326833497 - 1, 2 * 0.5560954623076415 - 1), abs=1e-9)
    low, high = stats.exact_conditional_interval(20, 30, 200, 0.05)
    scale = 50 / 200
    assert (low, high) == pytest.approx((scale * (2 * 0.4517940284791804 - 1), scale * (2 * 0.7359216049054262 - 1)))
    assert stats.exact_conditional_interval(0, 0, 30, 0.05) == (0.0, 0.0)


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.2])
def test_mcnemar_interval_excludes_zero_exactly_when_significant(alpha: float) -> None:
    # Every split of up to 60 discordant pairs (and a few n): the verdict and the interval agree,
    # and the interval holds the observed difference.
    for b in range(31):
        for c in range(31):
            n = b + c + (b * 7 + c) % 13
            if n == 0:
                continue
            test = stats.mcnemar_test([1.0] * b + [0.0] * (n - b), [0.0] * b + [1.0] * c + [0.0] * (n - b - c),
                                      alpha=alpha)  # fmt: skip
            excludes_zero = test.diff_ci_low > 0 or test.diff_ci_high < 0
            assert excludes_zero == test.significant == (stats.mcnemar_exact_p(b, c) < alpha), (b, c, n)
            assert test.diff_ci_low <= test.difference <= test.diff_ci_high


def test_mcnemar_interval_agrees_at_the_boundary_of_significance() -> None:
    # b=1, c=8: p = 2 * 10 / 512 = 0.0390625; alpha exactly p is not significant (p < alpha is strict).
    p = stats.mcnemar_exact_p(1, 8)
    assert p == 20 / 512
    at_p = stats.exact_conditional_interval(1, 8, 9, p)
    assert at_p[0] <= 0 < at_p[1]
    just_above = stats.exact_conditional_interval(1, 8, 9, math.nextafter(p, 1.0))
    assert just_above[0] > 0


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


def test_bootstrap_resamples_in_batches_give_the_unbatched_means() -> None:
    data = np.linspace(0.0, 1.0, 37)
    whole = data[np.random.default_rng(4).integers(0, 37, size=(101, 37))].mean(axis=1)
    for batch_elements in (1, 37, 100, 37 * 101, 10**6):
        batched = stats.resampled_means(data, 101, np.random.default_rng(4), batch_elements=batch_elements)
        np.testing.assert_array_equal(batched, whole)


def test_bootstrap_memory_stays_bounded_at_large_n() -> None:
    # 200 resamples of 100,000 examples: an index matrix of 160 MB when drawn at once.
    values = np.random.default_rng(0).random(100_000)
    tracemalloc.start()
    try:
        stats.paired_bootstrap_test(values, values + 0.01, samples=200, seed=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 80 * 2**20, f"peak {peak / 2**20:.0f} MiB"
