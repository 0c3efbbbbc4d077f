"""Intervals and paired tests for evaluation metrics, in plain Python and numpy (no scipy).

- A rate of correct answers gets a Wilson score interval: unlike the normal (Wald) interval it
  stays inside [0, 1] and keeps its coverage at small n and at rates near 0 or 1.
- A continuous metric (ROUGE, BLEU, ...) gets a percentile bootstrap interval of its mean.
- Two models scored on the same examples are compared by a paired test: McNemar's test for
  correct/incorrect outcomes (only the examples where the models disagree carry evidence of a
  difference), and a paired bootstrap test for continuous metrics.
- The interval on an accuracy difference is Tango's score interval, the interval McNemar's test
  inverts, at the test's own level: it excludes 0 exactly when the test is significant. It is
  unconditional (the number of disagreements is random, not fixed), so it keeps its coverage at
  the boundary where one model is never right; ``benchmarks/bench_interval_coverage.py`` prints
  its coverage by simulation.
- Equivalence at a margin m is the two one-sided tests (TOST, Schuirmann 1987): the models are
  equivalent when both "difference <= -m" and "difference >= +m" are rejected at ``alpha``, which is
  the same as the (1 - 2 alpha) interval of the difference lying inside (-m, +m). For accuracies
  each side is Tango's score test at delta = -m and +m (the statistic the interval above inverts);
  for continuous metrics each side is read off the paired bootstrap distribution of the difference.
  Its type-I error at the margin is checked by simulation in ``tests/unit/test_eval_equivalence.py``.
- Bootstrap resampling draws its indices a bounded batch at a time (memory stays flat at any n),
  from one seeded stream, so results do not depend on the batch size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

MetricKind = Literal["binary", "continuous"]


@dataclass(frozen=True)
class Estimate:
    """A metric's value over n examples, with its confidence interval."""

    value: float
    ci_low: float
    ci_high: float
    n: int
    method: str

    def to_dict(self) -> dict[str, Any]:
        """The estimate as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Equivalence:
    """A TOST equivalence test of the difference B - A at a margin: equivalent when both one-sided
    nulls (difference <= -margin, difference >= +margin) are rejected at ``alpha``."""

    margin: float
    p_value: float  # the larger one-sided p-value: TOST rejects both nulls exactly when it is below alpha
    p_lower: float  # null: difference <= -margin
    p_upper: float  # null: difference >= +margin
    equivalent: bool
    method: str

    def to_dict(self) -> dict[str, Any]:
        """The test as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class PairedTest:
    """Whether model B differs from model A on the same examples (difference = B - A).

    ``equivalence`` holds a TOST per margin asked for (:class:`Equivalence`); ``flips`` the examples
    a binary metric's outcome changed on: ``right_to_wrong`` (A right, B wrong) and ``wrong_to_right``.
    """

    test: str
    statistic: float
    p_value: float
    significant: bool
    difference: float
    diff_ci_low: float
    diff_ci_high: float
    n: int
    detail: dict[str, int]
    confidence: float  # level of the difference's interval
    equivalence: tuple[Equivalence, ...] = ()
    flips: dict[str, int] = field(default_factory=dict)

    def at_margin(self, margin: float) -> Equivalence | None:
        """The equivalence test at ``margin``, if one was run."""
        return next((e for e in self.equivalence if math.isclose(e.margin, margin, rel_tol=1e-9)), None)

    def to_dict(self) -> dict[str, Any]:
        """The test as a JSON-ready dict."""
        return asdict(self)


# Resampled indices held at once by a bootstrap (32 MiB of int64), whatever the number of examples.
_BOOTSTRAP_BATCH_ELEMENTS = 1 << 22


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``successes / n``."""
    if n == 0:
        return (0.0, 1.0)
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(
    values: Sequence[float], confidence: float = 0.95, samples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (seeded, so reports reproduce)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return (math.nan, math.nan)
    means = resampled_means(data, samples, np.random.default_rng(seed))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return (float(low), float(high))


def resampled_means(
    data: np.ndarray, samples: int, rng: np.random.Generator, batch_elements: int = _BOOTSTRAP_BATCH_ELEMENTS
) -> np.ndarray:
    """Means of ``samples`` bootstrap resamples of ``data``, drawn a bounded number of rows at a time.

    The rows come from one stream of ``rng`` in order, so any ``batch_elements`` gives the same means
    as drawing the whole ``samples x n`` index matrix at once (which needs 1.6 GB at n = 100,000).
    """
    n = int(data.size)
    means = np.empty(samples, dtype=np.float64)
    for start, stop in _batches(samples, max(1, batch_elements // max(n, 1))):
        means[start:stop] = data[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return means


def resampled_sums(
    rows: np.ndarray, samples: int, rng: np.random.Generator, batch_elements: int = _BOOTSTRAP_BATCH_ELEMENTS
) -> np.ndarray:
    """Column sums of ``samples`` bootstrap resamples of the rows of an ``n x k`` array, in bounded batches."""
    n, k = rows.shape
    sums = np.empty((samples, k), dtype=np.float64)
    for start, stop in _batches(samples, max(1, batch_elements // max(n * k, 1))):
        sums[start:stop] = rows[rng.integers(0, n, size=(stop - start, n))].sum(axis=1)
    return sums


def _batches(total: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, size):
        yield start, min(start + size, total)


def corpus_estimate(
    rows: np.ndarray, score: Callable[[Sequence[float]], float], confidence: float, samples: int, seed: int
) -> Estimate:
    """A corpus metric (``score`` of the summed per-example statistics ``rows``) with a percentile
    bootstrap interval over examples."""
    n = int(rows.shape[0])
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "corpus_bootstrap")
    scores = [score(s) for s in resampled_sums(rows, samples, np.random.default_rng(seed))]
    low, high = np.quantile(scores, [(1 - confidence) / 2, (1 + confidence) / 2])
    return Estimate(score(rows.sum(axis=0)), float(low), float(high), n, "corpus_bootstrap")


def corpus_paired_test(
    rows_a: np.ndarray,
    rows_b: np.ndarray,
    score: Callable[[Sequence[float]], float],
    *,
    test: str,
    p_value: float,
    confidence: float,
    alpha: float,
    samples: int,
    seed: int,
    margins: Sequence[float] = (),
) -> PairedTest:
    """Two models' corpus metric compared on the same examples (difference = B - A).

    The p-value comes from the metric's own paired test; the difference gets a paired percentile
    bootstrap interval (both models' examples resampled with the same indices), and each of
    ``margins`` a TOST read off the same resamples.
    """
    _check_paired(rows_a, rows_b)
    k = rows_a.shape[1]
    sums = resampled_sums(np.hstack([rows_a, rows_b]), samples, np.random.default_rng(seed))
    diffs = np.asarray([score(s[k:]) - score(s[:k]) for s in sums], dtype=np.float64)
    low, high = np.quantile(diffs, [(1 - confidence) / 2, (1 + confidence) / 2])
    observed = score(rows_b.sum(axis=0)) - score(rows_a.sum(axis=0))
    n = int(rows_a.shape[0])
    equivalence = tuple(bootstrap_tost(diffs, m, alpha) for m in margins)
    significant = p_value < alpha
    return PairedTest(test, observed, p_value, significant, observed, float(low), float(high), n, {}, confidence,
                      equivalence)  # fmt: skip


def estimate(
    values: Sequence[float], kind: MetricKind, confidence: float = 0.95, samples: int = 2000, seed: int = 0
) -> Estimate:
    """The mean of per-example scores with a Wilson (binary) or bootstrap (continuous) interval."""
    n = len(values)
    mean = float(np.mean(values)) if n else math.nan
    if kind == "binary":
        low, high = wilson_interval(round(sum(values)), n, confidence)
        return Estimate(mean, low, high, n, "wilson")
    low, high = bootstrap_interval(values, confidence, samples, seed)
    return Estimate(mean, low, high, n, "bootstrap")


def mcnemar_test(
    correct_a: Sequence[float],
    correct_b: Sequence[float],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    margins: Sequence[float] = (),
) -> PairedTest:
    """McNemar's test of two models' correct/incorrect outcomes on the same examples.

    The test is the asymptotic (score) McNemar test, chi2 = (c - b)^2 / (b + c) with one degree of
    freedom, which Fagerland, Lydersen and Laake (BMC Med Res Methodol 2013, 13:91) recommend over
    the exact conditional test: it is rarely above its nominal level and has more power. The
    difference in accuracy (B - A) gets Tango's score interval at level ``1 - alpha`` (see
    :func:`tango_interval`), the interval this test inverts, so the interval and the verdict beside
    it always agree; ``confidence`` is accepted for a uniform signature and not used here. Each of
    ``margins`` gets a TOST equivalence test (:func:`tango_tost`).
    """
    del confidence  # the interval of a test is at the test's level
    _check_paired(correct_a, correct_b)
    n = len(correct_a)
    b = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and not y)
    c = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if y and not x)
    both = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and y)
    p = mcnemar_p(b, c)
    diff = (c - b) / n if n else 0.0
    low, high = tango_interval(b, c, n, alpha)
    detail = {"only_a_correct": b, "only_b_correct": c, "both_correct": both, "both_wrong": n - b - c - both}
    chi2 = (c - b) ** 2 / (b + c) if b + c else 0.0
    equivalence = tuple(tango_tost(b, c, n, m, alpha) for m in margins)
    flips = {"right_to_wrong": b, "wrong_to_right": c}
    return PairedTest("mcnemar", chi2, p, p < alpha, diff, low, high, n, detail, 1 - alpha, equivalence, flips)


def mcnemar_p(b: int, c: int) -> float:
    """Two-sided p-value of the asymptotic McNemar test from the discordant counts.

    ``b`` examples only model A got right, ``c`` only model B; z = (c - b) / sqrt(b + c) is
    standard normal under the null hypothesis (no continuity correction). With no discordant
    example there is no evidence of a difference: p = 1.
    """
    if b + c == 0:
        return 1.0
    return math.erfc(abs(c - b) / math.sqrt(b + c) / math.sqrt(2))


def tango_score(delta: float, b: int, c: int, n: int) -> float:
    """Tango's score statistic for the hypothesis that the accuracy difference B - A is ``delta``.

    With p_a the chance that only A is right, its maximum-likelihood estimate under the constraint
    "P(only B right) - P(only A right) = delta" is the root of a quadratic (Tango, Stat Med 1998,
    17:891-908, in the notation of Fagerland, Lydersen and Laake, Stat Med 2014, 33:2850-2875), and
    Z = (c - b - n delta) / sqrt(n (2 p_a + delta (1 - delta))). Z falls from +inf at delta = -1 to
    -inf at delta = 1, and at delta = 0 it is McNemar's z, (c - b) / sqrt(b + c).
    """
    qa = 2 * n
    qb = -c - b + (2 * n - c + b) * delta
    qc = -b * delta * (1 - delta)
    p_a = (math.sqrt(max(qb * qb - 4 * qa * qc, 0.0)) - qb) / (2 * qa)
    variance = n * (2 * p_a + delta * (1 - delta))
    numerator = c - b - n * delta
    if variance <= 0:
        return math.copysign(math.inf, numerator) if numerator else 0.0
    return numerator / math.sqrt(variance)


@functools.lru_cache(maxsize=4096)
def tango_interval(b: int, c: int, n: int, alpha: float) -> tuple[float, float]:
    """Tango's score interval of the accuracy difference (c - b) / n, unconditional and at level 1 - alpha.

    The interval is every delta whose score test (see :func:`tango_score`) is not rejected at
    ``alpha``: |Z(delta)| <= z. It does not treat the number of disagreements b + c as fixed, so
    at the boundary (one model never right, b = 0) its upper bound lies above the estimate: there
    it is the Wilson upper bound of c / n. Fagerland et al. (2014) recommend it for its coverage
    close to the nominal level at every n. Since Z(0) is McNemar's z, the interval excludes 0
    exactly when :func:`mcnemar_p` is below ``alpha``: each bound is found by bisection whose first
    step is that test itself, so floating-point error cannot put a bound on the wrong side of 0.
    """
    if n == 0:
        return (-1.0, 1.0)
    z = _z(1 - alpha)
    significant = mcnemar_p(b, c) < alpha
    # Z(delta) - z falls through 0 at the lower bound, Z(delta) + z at the upper bound.
    low = _bisect_falling(lambda d: tango_score(d, b, c, n) - z, positive=significant and c > b)
    high = _bisect_falling(lambda d: tango_score(d, b, c, n) + z, positive=not (significant and c < b))
    return (low, high)


def _upper_tail(z: float) -> float:
    """P(Z >= z) for a standard normal Z (exact at the infinities)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def tango_tost(b: int, c: int, n: int, margin: float, alpha: float) -> Equivalence:
    """TOST of the accuracy difference (c - b) / n at ``margin``, each side a one-sided Tango score test.

    "difference <= -margin" is rejected when Z(-margin) is large, "difference >= +margin" when
    Z(+margin) is very negative (:func:`tango_score`). Both rejected at ``alpha`` is the same as
    Tango's interval at level 1 - 2 alpha lying inside (-margin, +margin). A margin of 1 or more
    holds every difference of two accuracies.
    """
    if n == 0:
        p_lower = p_upper = 1.0
    elif margin >= 1:
        p_lower = p_upper = 0.0
    else:
        p_lower = _upper_tail(tango_score(-margin, b, c, n))
        p_upper = _upper_tail(-tango_score(margin, b, c, n))
    p = max(p_lower, p_upper)
    return Equivalence(margin, p, p_lower, p_upper, p < alpha, "tango_tost")


def bootstrap_tost(resampled: np.ndarray, margin: float, alpha: float) -> Equivalence:
    """TOST at ``margin`` read off a paired bootstrap distribution of the difference B - A.

    Each one-sided p-value is the share of resampled differences on the null's side of the margin,
    counted as ``(k + 1) / (samples + 1)`` as the paired bootstrap test counts its own; both below
    ``alpha`` is the percentile interval at level 1 - 2 alpha lying inside (-margin, +margin).
    """
    samples = int(resampled.size)
    p_lower = float(((resampled <= -margin).sum() + 1) / (samples + 1))
    p_upper = float(((resampled >= margin).sum() + 1) / (samples + 1))
    p = max(p_lower, p_upper)
    return Equivalence(margin, p, p_lower, p_upper, p < alpha, "bootstrap_tost")


def _bisect_falling(falling: Callable[[float], float], *, positive: bool) -> float:
    """The root in (-1, 1) of a decreasing function known to lie above 0 or at/below it.

    Returns the end of the final bracket (width 1e-12) farther from 0: a root above 0 stays
    strictly above it, and one at or below 0 is rounded outwards.
    """
    lo, hi = (0.0, 1.0) if positive else (-1.0, 0.0)
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if falling(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi if positive else lo


def paired_bootstrap_test(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    samples: int = 2000,
    seed: int = 0,
    margins: Sequence[float] = (),
) -> PairedTest:
    """Paired bootstrap test of the mean difference B - A of a continuous per-example metric.

    Examples are resampled as pairs. The p-value is the share of resampled differences, shifted
    to mean zero (the null hypothesis), at least as far from zero as the observed one; the
    interval is the percentile interval of the resampled differences; each of ``margins`` gets a
    TOST read off the same resamples (:func:`bootstrap_tost`).
    """
    _check_paired(scores_a, scores_b)
    d = np.asarray(scores_b, dtype=np.float64) - np.asarray(scores_a, dtype=np.float64)
    n = int(d.size)
    if n == 0:
        equivalence = tuple(Equivalence(m, 1.0, 1.0, 1.0, False, "bootstrap_tost") for m in margins)
        return PairedTest("paired_bootstrap", 0.0, 1.0, False, 0.0, 0.0, 0.0, 0, {}, confidence, equivalence)
    means = resampled_means(d, samples, np.random.default_rng(seed))
    observed = float(d.mean())
    extreme = np.abs(means - observed) >= abs(observed) - 1e-12
    p = float((extreme.sum() + 1) / (samples + 1)) if observed != 0 else 1.0
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    detail = {"b_better": int((d > 0).sum()), "a_better": int((d < 0).sum()), "ties": int((d == 0).sum())}
    equivalence = tuple(bootstrap_tost(means, m, alpha) for m in margins)
    interval = (float(low), float(high))
    verdict = p < alpha
    return PairedTest("paired_bootstrap", observed, p, verdict, observed, *interval, n, detail, confidence, equivalence)


def paired_test(
    kind: MetricKind,
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    samples: int = 2000,
    seed: int = 0,
    margins: Sequence[float] = (),
) -> PairedTest:
    """McNemar for binary metrics, paired bootstrap for continuous ones; a TOST at each of ``margins``."""
    if kind == "binary":
        return mcnemar_test(scores_a, scores_b, confidence=confidence, alpha=alpha, margins=margins)
    return paired_bootstrap_test(
        scores_a, scores_b, confidence=confidence, alpha=alpha, samples=samples, seed=seed, margins=margins
    )


def _check_paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> None:
    if len(a) != len(b):
        raise ValueError(f"paired test needs scores of the same examples: got {len(a)} and {len(b)} scores")
