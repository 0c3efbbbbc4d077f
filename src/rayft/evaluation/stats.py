"""Intervals and paired tests for evaluation metrics, in plain Python and numpy (no scipy).

- A rate of correct answers gets a Wilson score interval: unlike the normal (Wald) interval it
  stays inside [0, 1] and keeps its coverage at small n and at rates near 0 or 1.
- A continuous metric (ROUGE, BLEU, ...) gets a percentile bootstrap interval of its mean.
- Two models scored on the same examples are compared by a paired test: the exact McNemar test
  for correct/incorrect outcomes (only the examples where the models disagree carry
  information), and a paired bootstrap test for continuous metrics.
- The interval on an accuracy difference is the exact conditional one, the interval the exact
  McNemar test inverts, at the test's own level: it excludes 0 exactly when the test is significant.
- Bootstrap resampling draws its indices a bounded batch at a time (memory stays flat at any n),
  from one seeded stream, so results do not depend on the batch size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
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
class PairedTest:
    """Whether model B differs from model A on the same examples (difference = B - A)."""

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
) -> PairedTest:
    """Two models' corpus metric compared on the same examples (difference = B - A).

    The p-value comes from the metric's own paired test; the difference gets a paired percentile
    bootstrap interval (both models' examples resampled with the same indices).
    """
    _check_paired(rows_a, rows_b)
    k = rows_a.shape[1]
    sums = resampled_sums(np.hstack([rows_a, rows_b]), samples, np.random.default_rng(seed))
    diffs = [score(s[k:]) - score(s[:k]) for s in sums]
    low, high = np.quantile(diffs, [(1 - confidence) / 2, (1 + confidence) / 2])
    observed = score(rows_b.sum(axis=0)) - score(rows_a.sum(axis=0))
    n = int(rows_a.shape[0])
    return PairedTest(test, observed, p_value, p_value < alpha, observed, float(low), float(high), n, {}, confidence)


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


@functools.lru_cache(maxsize=256)
def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    ``b`` examples only model A got right, ``c`` only model B. Under the null hypothesis each
    discordant example is a fair coin, so p = 2 * P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2),
    capped at 1. Computed with exact integers (each binomial coefficient from the previous one).
    """
    n = b + c
    if n == 0:
        return 1.0
    tail, term = 0, 1
    for i in range(min(b, c) + 1):
        tail += term
        term = term * (n - i) // (i + 1)
    return float(min(1.0, 2 * tail / 2**n))


def mcnemar_test(
    correct_a: Sequence[float], correct_b: Sequence[float], *, confidence: float = 0.95, alpha: float = 0.05
) -> PairedTest:
    """Exact McNemar test of two models' correct/incorrect outcomes on the same examples.

    The difference in accuracy (B - A) gets the exact conditional interval at level ``1 - alpha``
    (see :func:`exact_conditional_interval`), so that the interval and the verdict beside it
    always agree; ``confidence`` is accepted for a uniform signature and not used here.
    """
    del confidence  # the interval of a test is at the test's level
    _check_paired(correct_a, correct_b)
    n = len(correct_a)
    b = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and not y)
    c = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if y and not x)
    both = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and y)
    p = mcnemar_exact_p(b, c)
    diff = (c - b) / n if n else 0.0
    low, high = exact_conditional_interval(b, c, n, alpha)
    detail = {"only_a_correct": b, "only_b_correct": c, "both_correct": both, "both_wrong": n - b - c - both}
    return PairedTest("mcnemar_exact", float(min(b, c)), p, p < alpha, diff, low, high, n, detail, 1 - alpha)


def exact_conditional_interval(b: int, c: int, n: int, alpha: float) -> tuple[float, float]:
    """Interval of the accuracy difference (c - b) / n that agrees with the exact McNemar test.

    Given the m = b + c discordant examples, c ~ Binomial(m, pi) with pi the chance that a
    disagreement goes B's way, and the difference is (m / n) * (2 pi - 1). The Clopper-Pearson
    interval of pi at level 1 - alpha inverts two one-sided binomial tests at alpha / 2 each; at
    pi = 1/2 their tails are half the two-sided McNemar p-value, so 1/2 lies outside the interval
    exactly when p < alpha. Each bound is found by bisection whose first step is that test
    itself, so floating-point error cannot put a bound on the wrong side of 0. The interval is
    conditional on the observed share of disagreements m / n (with none, it is [0, 0]).
    """
    m = b + c
    if n == 0 or m == 0:
        return (0.0, 0.0)
    significant = mcnemar_exact_p(b, c) < alpha
    log_pmf = _binomial_log_coefficients(m)
    # P(X >= c; pi) rises with pi; the lower bound is where it reaches alpha / 2 (0 when c = 0).
    low = 0.0 if c == 0 else _bisect(lambda q: _tail(log_pmf, q, c, m) - alpha / 2, above=significant and c > b)
    # P(X <= c; pi) falls with pi; the upper bound is where it drops to alpha / 2 (1 when c = m).
    high = 1.0 if c == m else _bisect(lambda q: alpha / 2 - _tail(log_pmf, q, 0, c), above=not (significant and c < b))
    scale = m / n
    return (scale * (2 * low - 1), scale * (2 * high - 1))


def _binomial_log_coefficients(m: int) -> np.ndarray:
    """log C(m, i) for i = 0..m."""
    log_factorial: np.ndarray = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, m + 1, dtype=np.float64)))])
    coefficients: np.ndarray = log_factorial[m] - log_factorial - log_factorial[::-1]
    return coefficients


def _tail(log_coefficients: np.ndarray, q: float, first: int, last: int) -> float:
    """P(first <= X <= last) for X ~ Binomial(m, q), 0 < q < 1, summed in log space."""
    m = log_coefficients.size - 1
    i = np.arange(first, last + 1, dtype=np.float64)
    terms = log_coefficients[first : last + 1] + i * math.log(q) + (m - i) * math.log1p(-q)
    top = float(terms.max())
    return float(math.exp(top) * np.exp(terms - top).sum())


def _bisect(rising: Callable[[float], float], *, above: bool) -> float:
    """The root in (0, 1) of an increasing function known to lie above 1/2 or at/below it.

    Returns the end of the final bracket (width 1e-12) farther from 1/2: a root above 1/2 stays
    strictly above it, and one at or below 1/2 is rounded outwards.
    """
    lo, hi = (0.5, 1.0) if above else (0.0, 0.5)
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if rising(mid) < 0:
            lo = mid
        else:
            hi = mid
    return hi if above else lo


def paired_bootstrap_test(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    samples: int = 2000,
    seed: int = 0,
) -> PairedTest:
    """Paired bootstrap test of the mean difference B - A of a continuous per-example metric.

    Examples are resampled as pairs. The p-value is the share of resampled differences, shifted
    to mean zero (the null hypothesis), at least as far from zero as the observed one; the
    interval is the percentile interval of the resampled differences.
    """
    _check_paired(scores_a, scores_b)
    d = np.asarray(scores_b, dtype=np.float64) - np.asarray(scores_a, dtype=np.float64)
    n = int(d.size)
    if n == 0:
        return PairedTest("paired_bootstrap", 0.0, 1.0, False, 0.0, 0.0, 0.0, 0, {}, confidence)
    means = resampled_means(d, samples, np.random.default_rng(seed))
    observed = float(d.mean())
    extreme = np.abs(means - observed) >= abs(observed) - 1e-12
    p = float((extreme.sum() + 1) / (samples + 1)) if observed != 0 else 1.0
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    detail = {"b_better": int((d > 0).sum()), "a_better": int((d < 0).sum()), "ties": int((d == 0).sum())}
    return PairedTest(
        "paired_bootstrap", observed, p, p < alpha, observed, float(low), float(high), n, detail, confidence
    )


def paired_test(
    kind: MetricKind,
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    samples: int = 2000,
    seed: int = 0,
) -> PairedTest:
    """McNemar for binary metrics, paired bootstrap for continuous ones."""
    if kind == "binary":
        return mcnemar_test(scores_a, scores_b, confidence=confidence, alpha=alpha)
    return paired_bootstrap_test(scores_a, scores_b, confidence=confidence, alpha=alpha, samples=samples, seed=seed)


def _check_paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> None:
    if len(a) != len(b):
        raise ValueError(f"paired test needs scores of the same examples: got {len(a)} and {len(b)} scores")
