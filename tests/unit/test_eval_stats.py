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
        (1, 6, 0.058781721),  # z = 5 / sqrt(7): 2 * (1 - Phi(1.8898))
        (0, 10, 0.001565402),  # z = sqrt(10)
        (2, 8, 0.057779571),  # z = 6 / sqrt(10)
        (5, 5, 1.0),
        (0, 0, 1.0),
        (6, 1, 0.058781721),  # symmetric
    ],
)
def test_mcnemar_p_values(b: int, c: int, p: float) -> None:
    assert stats.mcnemar_p(b, c) == pytest.approx(p, rel=1e-6)


def test_mcnemar_uses_only_discordant_pairs() -> None:
    # 20 examples: 10 both right, 0 only A, 10 only B -> z = sqrt(10), chi2 = 10.
    a = [1.0] * 10 + [0.0] * 10
    b = [1.0] * 20
    test = stats.mcnemar_test(a, b)
    assert test.test == "mcnemar"
    assert test.statistic == pytest.approx(10.0)
    assert test.p_value == pytest.approx(0.001565402, rel=1e-6)
    assert test.significant
    assert test.difference == pytest.approx(0.5)
    assert test.detail == {"only_a_correct": 0, "only_b_correct": 10, "both_correct": 10, "both_wrong": 0}
    assert 0 < test.diff_ci_low < 0.5 < test.diff_ci_high


def test_tango_interval_reproduces_the_published_example() -> None:
    # Airway hyper-responsiveness before and after stem cell transplantation (Bentur et al. 2009):
    # n11 = 1, n12 = 1, n21 = 7, n22 = 12. Fagerland, Lydersen and Laake, "Recommended tests and
    # confidence intervals for paired binomial proportions", Stat Med 2014, 33:2850-2875, report the
    # Tango asymptotic score interval of p1+ - p+1 = -0.286 as (-0.517, -0.026). Here model A plays
    # the second measurement: it alone is right 7 times, B alone once.
    low, high = stats.tango_interval(7, 1, 21, 0.05)
    assert (round(low, 3), round(high, 3)) == (-0.517, -0.026)


def _tango_by_quartic(b: int, c: int, n: int, alpha: float) -> tuple[float, float]:
    """Tango's bounds as the outer real roots of a quartic: the non-iterative method of Yang, Sun and
    Hardin (Stat Med 2013, 32:1336-1342), an implementation independent of the bisection in stats."""
    g = stats.NormalDist().inv_cdf(1 - alpha / 2) ** 2
    d, s = c - b, b + c  # their (Success, Failure) cell is B alone right
    coefficients = [
        n**2 * (n / g + 1) ** 2,
        -n * d * (n / g + 1) * (4 * n / g + 1),
        2 * n * d**2 * (3 * n / g + 2) / g - n**2 * (s / g + 1),
        n * d * (2 * s / g + 1) - d**3 * (4 * n / g + 1) / g,
        d**2 * (d**2 / g - s) / g,
    ]
    real = sorted(root.real for root in np.roots(coefficients) if abs(root.imag) < 1e-7)
    return (real[0], real[-1])


@pytest.mark.parametrize(("b", "c", "n"), [(0, 27, 100), (6, 16, 161), (40, 20, 160), (3, 3, 50), (10, 2, 40),
                                           (0, 0, 30), (0, 99, 100), (1, 2, 9)])  # fmt: skip
def test_tango_interval_matches_the_closed_form(b: int, c: int, n: int) -> None:
    assert stats.tango_interval(b, c, n, 0.05) == pytest.approx(_tango_by_quartic(b, c, n, 0.05), abs=1e-7)


def test_interval_at_the_boundary_reaches_above_the_estimate() -> None:
    # Base never right, tuned right on 27 of 100: the conditional interval was [+0.201, +0.270].
    # With b = 0 the score interval's upper bound is the Wilson upper bound of 27 / 100.
    test = stats.mcnemar_test([0.0] * 100, [1.0] * 27 + [0.0] * 73)
    assert test.difference == pytest.approx(0.27)
    assert test.diff_ci_high == pytest.approx(stats.wilson_interval(27, 100)[1], abs=1e-9)
    assert (round(test.diff_ci_low, 3), round(test.diff_ci_high, 3)) == (0.193, 0.364)
    # No disagreement at all still leaves an interval of plausible differences, not [0, 0].
    agree = stats.mcnemar_test([1.0] * 10 + [0.0] * 20, [1.0] * 10 + [0.0] * 20)
    assert agree.diff_ci_low == pytest.approx(-agree.diff_ci_high) and agree.diff_ci_high > 0.1
    # B right wherever A is wrong, on every example: the difference is 1, as is its upper bound.
    assert stats.tango_interval(0, 100, 100, 0.05) == (pytest.approx(0.926013, abs=1e-6), 1.0)


def test_mcnemar_interval_does_not_contradict_the_test_on_a_small_improvement() -> None:
    # 80 examples, B alone right on 3, A alone right on none: z = sqrt(3), p = 0.083, not significant,
    # so the interval must contain 0 (a Wald interval gives [+0.0005, +0.0745]).
    a = [0.0] * 3 + [1.0] * 40 + [0.0] * 37
    b = [1.0] * 3 + [1.0] * 40 + [0.0] * 37
    test = stats.mcnemar_test(a, b)
    assert test.p_value == pytest.approx(0.0832645, rel=1e-5)
    assert not test.significant
    assert test.diff_ci_low < 0 < 3 / 80 < test.diff_ci_high


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
            assert excludes_zero == test.significant == (stats.mcnemar_p(b, c) < alpha), (b, c, n)
            assert test.diff_ci_low <= test.difference <= test.diff_ci_high


def test_mcnemar_interval_agrees_at_the_boundary_of_significance() -> None:
    # b=1, c=8: alpha exactly p is not significant (p < alpha is strict); just above it is.
    p = stats.mcnemar_p(1, 8)
    at_p = stats.tango_interval(1, 8, 9, p)
    assert at_p[0] <= 0 < at_p[1]
    just_above = stats.tango_interval(1, 8, 9, math.nextafter(p, 1.0))
    assert just_above[0] > 0


@pytest.mark.parametrize(
    ("p_a", "p_b", "p_both"),
    [
        (0.0, 0.27, 0.0),  # the boundary: the base is never right
        (0.0, 0.05, 0.0),  # the boundary with few successes
        (0.3, 0.3, 0.2),  # no difference, correlated outcomes
        (0.5, 0.6, 0.45),
        (0.2, 0.5, 0.15),
        (0.7, 0.75, 0.6),
    ],
)
def test_interval_coverage_by_simulation(p_a: float, p_b: float, p_both: float) -> None:
    # Pairs of outcomes drawn with P(A right) = p_a, P(B right) = p_b, P(both right) = p_both;
    # the 95% interval must hold the true difference p_b - p_a about 95% of the time. With 4000
    # draws the standard error of a coverage near 0.95 is 0.0035.
    coverage = stats_coverage(p_a, p_b, p_both, n=100, draws=4000, seed=7)
    assert 0.93 <= coverage <= 0.985, coverage


def stats_coverage(p_a: float, p_b: float, p_both: float, *, n: int, draws: int, seed: int) -> float:
    """Share of seeded simulated evaluations whose Tango interval covers p_b - p_a."""
    cells = [p_both, p_a - p_both, p_b - p_both, 1 - p_a - p_b + p_both]  # both, A only, B only, neither
    counts = np.random.default_rng(seed).multinomial(n, cells, size=draws)
    truth = p_b - p_a
    covered = 0
    for _, only_a, only_b, _ in counts:
        low, high = stats.tango_interval(int(only_a), int(only_b), n, 0.05)
        covered += low <= truth <= high
    return covered / draws


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
