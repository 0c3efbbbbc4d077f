"""TOST equivalence and flip counts: against a direct computation and a simulation of their error rates."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import norm

from rayft.evaluation import stats
from rayft.evaluation.summary import PairComparison


def _score_by_likelihood(delta: float, b: int, c: int, n: int) -> float:
    """Tango's Z at ``delta`` with the constrained maximum-likelihood estimate found numerically (scipy),
    independently of the closed-form root in stats: P(only A right) = p, P(only B right) = p + delta."""
    rest = n - b - c

    def negative_log_likelihood(p: float) -> float:
        cells = ((b, p), (c, p + delta), (rest, 1 - 2 * p - delta))
        return -sum(k * math.log(q) for k, q in cells if k)

    lo, hi = max(0.0, -delta) + 1e-13, (1 - delta) / 2 - 1e-13
    p = optimize.minimize_scalar(negative_log_likelihood, bounds=(lo, hi), method="bounded",
                                 options={"xatol": 1e-13}).x  # fmt: skip
    return (c - b - n * delta) / math.sqrt(n * (2 * p + delta - delta * delta))


CASES = [
    (6, 16, 161, 0.1),
    (40, 20, 160, 0.05),
    (3, 3, 50, 0.2),
    (10, 2, 40, 0.3),
    (1, 2, 300, 0.02),
    (12, 15, 400, 0.05),
]


@pytest.mark.parametrize(("b", "c", "n", "margin"), CASES)
def test_tango_tost_p_values_match_a_direct_computation(b: int, c: int, n: int, margin: float) -> None:
    tost = stats.tango_tost(b, c, n, margin, 0.05)
    p_lower = norm.sf(_score_by_likelihood(-margin, b, c, n))  # null: difference <= -margin
    p_upper = norm.cdf(_score_by_likelihood(margin, b, c, n))  # null: difference >= +margin
    # The numerical optimum sits within ~1e-9 of the root; Z moves by less than 1e-6 with it.
    assert (tost.p_lower, tost.p_upper) == (pytest.approx(p_lower, abs=1e-6), pytest.approx(p_upper, abs=1e-6))
    assert tost.p_value == max(tost.p_lower, tost.p_upper)
    assert tost.equivalent == (max(p_lower, p_upper) < 0.05)


def test_tost_is_the_interval_at_twice_alpha_inside_the_margin() -> None:
    # Every split of up to 40 discordant pairs at n = 120: equivalent exactly when Tango's
    # interval at level 1 - 2 alpha lies inside (-margin, +margin) (away from ties at the margin).
    for b in range(21):
        for c in range(21):
            low, high = stats.tango_interval(b, c, 120, 0.10)
            for margin in (0.05, 0.1, 0.2):
                if min(abs(low + margin), abs(high - margin)) < 1e-6:
                    continue
                assert stats.tango_tost(b, c, 120, margin, 0.05).equivalent == (-margin < low and high < margin)


def test_tost_edges() -> None:
    assert stats.tango_tost(0, 0, 0, 0.1, 0.05).p_value == 1.0  # no examples: no evidence
    assert stats.tango_tost(3, 90, 100, 1.0, 0.05).equivalent  # a margin of 1 holds every difference
    # Models that never disagree on 1000 examples are equivalent within 0.01.
    assert stats.tango_tost(0, 0, 1000, 0.01, 0.05).equivalent


def _tost_rejections(cells: list[float], n: int, margin: float, draws: int, seed: int) -> float:
    """Share of seeded simulated evaluations (cells: both, A only, B only, neither) found equivalent."""
    counts = np.random.default_rng(seed).multinomial(n, cells, size=draws)
    found = sum(stats.tango_tost(int(a), int(b), n, margin, 0.05).equivalent for _, a, b, _ in counts)
    return found / draws


@pytest.mark.parametrize(
    ("p_a", "p_b", "p_both", "n", "margin"),
    [
        (0.5, 0.6, 0.45, 200, 0.1),  # true difference at +margin
        (0.5, 0.4, 0.35, 200, 0.1),  # at -margin
        (0.3, 0.35, 0.25, 400, 0.05),
        (0.7, 0.8, 0.65, 100, 0.1),
        (0.1, 0.15, 0.1, 200, 0.05),  # B never worse than A
    ],
)
def test_tost_type_one_error_at_the_margin_is_at_most_alpha(
    p_a: float, p_b: float, p_both: float, n: int, margin: float
) -> None:
    # The true difference lies exactly on the margin, where the null hypothesis still holds:
    # equivalence may be declared at most alpha = 5% of the time. 20000 draws give a standard
    # error of 0.0015 at 0.05; the bound leaves three of them for the simulation's own noise
    # (40000 draws of these cases measured 0.026-0.049).
    cells = [p_both, p_a - p_both, p_b - p_both, 1 - p_a - p_b + p_both]
    assert _tost_rejections(cells, n, margin, draws=20000, seed=11) <= 0.05 + 3 * 0.0015


def test_tost_finds_equivalence_when_the_models_are_the_same() -> None:
    # Power: same accuracy, 10% discordant, 400 examples, margin 0.05. The difference's standard error
    # is sqrt(0.1 / 400) = 0.0158, so TOST succeeds when |difference| < 0.05 - 1.645 * 0.0158, a
    # chance of 2 Phi(1.51) - 1 = 0.87 by the normal approximation (SE of the simulation 0.0075).
    assert _tost_rejections([0.55, 0.05, 0.05, 0.35], 400, 0.05, draws=2000, seed=2) > 0.8


def test_bootstrap_tost_is_the_percentile_interval_at_twice_alpha_inside_the_margin() -> None:
    rng = np.random.default_rng(1)
    for shift in (0.0, 0.03, 0.08, -0.05):
        a = rng.random(80)
        b = a + shift + rng.normal(0, 0.1, 80)
        test = stats.paired_bootstrap_test(a, b, samples=999, seed=4, margins=(0.05, 0.1))
        means = stats.resampled_means(b - a, 999, np.random.default_rng(4))
        for tost in test.equivalence:
            below, above = (means <= -tost.margin).sum(), (means >= tost.margin).sum()
            assert (tost.p_lower, tost.p_upper) == ((below + 1) / 1000, (above + 1) / 1000)
            # p < alpha on both sides: fewer than 49 of 999 resamples beyond either margin.
            assert tost.equivalent == (below + 1 < 50 and above + 1 < 50)


def test_bootstrap_tost_type_one_error_at_the_margin_is_at_most_alpha() -> None:
    # Continuous scores whose true mean difference is the margin: 3000 simulated evaluations of
    # 60 examples, each with a 500-resample bootstrap. Standard error 0.004 at 0.05.
    rng = np.random.default_rng(5)
    found = 0
    for draw in range(3000):
        a = rng.random(60)
        b = a + 0.1 + rng.normal(0, 0.4, 60)
        found += stats.paired_bootstrap_test(a, b, samples=500, seed=draw, margins=(0.1,)).equivalence[0].equivalent
    assert found / 3000 <= 0.05 + 3 * 0.004


def test_flips_count_each_direction() -> None:
    a = [1, 1, 1, 0, 0, 0, 1, 0, 1, 1]
    b = [1, 0, 0, 1, 1, 1, 1, 0, 0, 1]
    test = stats.mcnemar_test([float(x) for x in a], [float(x) for x in b], margins=(0.1,))
    right_to_wrong = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    wrong_to_right = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    assert test.flips == {"right_to_wrong": right_to_wrong, "wrong_to_right": wrong_to_right}
    assert (right_to_wrong, wrong_to_right) == (3, 3)
    assert test.at_margin(0.1) == stats.tango_tost(3, 3, 10, 0.1, 0.05)
    assert test.at_margin(0.2) is None


def test_equivalence_and_flips_round_trip_through_json() -> None:
    test = stats.mcnemar_test([1.0, 0.0, 1.0, 0.0] * 10, [1.0, 1.0, 0.0, 0.0] * 10, margins=(0.02, 0.1))
    pair = PairComparison("base", "tuned", {"accuracy": test})
    plain = json.loads(json.dumps(pair.to_dict()))
    assert plain["tests"]["accuracy"]["equivalence"][1]["margin"] == 0.1
    assert plain["tests"]["accuracy"]["flips"] == {"right_to_wrong": 10, "wrong_to_right": 10}
    assert PairComparison.from_dict(plain) == pair
