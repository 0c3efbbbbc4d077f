"""Intervals and paired tests for evaluation metrics, in plain Python and numpy (no scipy).

- A rate of correct answers gets a Wilson score interval: unlike the normal (Wald) interval it
  stays inside [0, 1] and keeps its coverage at small n and at rates near 0 or 1.
- A continuous metric (ROUGE, BLEU, ...) gets a percentile bootstrap interval of its mean.
- Two models scored on the same examples are compared by a paired test: the exact McNemar test
  for correct/incorrect outcomes (only the examples where the models disagree carry
  information), and a paired bootstrap test for continuous metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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

    def to_dict(self) -> dict[str, Any]:
        """The test as a JSON-ready dict."""
        return asdict(self)


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
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(samples, data.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return (float(low), float(high))


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


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    ``b`` examples only model A got right, ``c`` only model B. Under the null hypothesis each
    discordant example is a fair coin, so p = 2 * P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2),
    capped at 1. Computed with exact integers.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return float(min(1.0, 2 * tail / 2**n))


def mcnemar_test(
    correct_a: Sequence[float], correct_b: Sequence[float], *, confidence: float = 0.95, alpha: float = 0.05
) -> PairedTest:
    """Exact McNemar test of two models' correct/incorrect outcomes on the same examples.

    The difference in accuracy (B - A) gets the Wald interval of a paired difference of
    proportions, var = ((b + c) - (c - b)^2 / n) / n^2.
    """
    _check_paired(correct_a, correct_b)
    n = len(correct_a)
    b = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and not y)
    c = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if y and not x)
    both = sum(1 for x, y in zip(correct_a, correct_b, strict=True) if x and y)
    p = mcnemar_exact_p(b, c)
    diff = (c - b) / n if n else 0.0
    half = _z(confidence) * math.sqrt(max((b + c) - (c - b) ** 2 / n, 0.0)) / n if n else 0.0
    detail = {"only_a_correct": b, "only_b_correct": c, "both_correct": both, "both_wrong": n - b - c - both}
    return PairedTest("mcnemar_exact", float(min(b, c)), p, p < alpha, diff, diff - half, diff + half, n, detail)


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
        return PairedTest("paired_bootstrap", 0.0, 1.0, False, 0.0, 0.0, 0.0, 0, {})
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, n, size=(samples, n))].mean(axis=1)
    observed = float(d.mean())
    extreme = np.abs(means - observed) >= abs(observed) - 1e-12
    p = float((extreme.sum() + 1) / (samples + 1)) if observed != 0 else 1.0
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    detail = {"b_better": int((d > 0).sum()), "a_better": int((d < 0).sum()), "ties": int((d == 0).sum())}
    return PairedTest("paired_bootstrap", observed, p, p < alpha, observed, float(low), float(high), n, detail)


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


def _check_paired(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b):
        raise ValueError(f"paired test needs scores of the same examples: got {len(a)} and {len(b)} scores")
