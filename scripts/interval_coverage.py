"""Coverage by simulation of the interval ``rayft compare`` gives an accuracy difference.

    .venv/bin/python scripts/interval_coverage.py [--n 100] [--draws 20000] [--seed 0]

Draws ``--draws`` evaluations of ``--n`` examples for each scenario (P(A right), P(B right),
P(both right)), and prints, as a Markdown table, how often each 95% interval of the difference
B - A holds the true difference: Tango's score interval (the one rayft reports), the exact
conditional interval (Clopper-Pearson of the share of disagreements going B's way, scaled by the
observed share of disagreements; rayft's earlier interval) and the Wald interval. Seeded, so the
table reproduces.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

import numpy as np

from rayft.evaluation import stats

# (P(A right), P(B right), P(both right)); the first three put the base at the boundary (never right).
SCENARIOS = [
    (0.0, 0.05, 0.0),
    (0.0, 0.27, 0.0),
    (0.0, 0.50, 0.0),
    (0.30, 0.30, 0.20),
    (0.50, 0.60, 0.45),
    (0.20, 0.50, 0.15),
    (0.70, 0.75, 0.60),
    (0.90, 0.95, 0.88),
]


@functools.cache
def conditional_interval(b: int, c: int, n: int) -> tuple[float, float]:
    """The exact conditional interval at 95%: Clopper-Pearson of c of b + c, scaled by (b + c) / n."""
    m = b + c
    if m == 0:
        return (0.0, 0.0)

    def upper_tail(q: float) -> float:  # P(X >= c), X ~ Binomial(m, q): rises with q
        return sum(math.comb(m, i) * q**i * (1 - q) ** (m - i) for i in range(c, m + 1))

    def lower_tail(q: float) -> float:  # P(X <= c): falls with q
        return sum(math.comb(m, i) * q**i * (1 - q) ** (m - i) for i in range(0, c + 1))

    low = 0.0 if c == 0 else _root(lambda q: upper_tail(q) - 0.025)
    high = 1.0 if c == m else _root(lambda q: 0.025 - lower_tail(q))
    return (m / n * (2 * low - 1), m / n * (2 * high - 1))


def _root(rising: Callable[[float], float]) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if rising(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def wald_interval(b: int, c: int, n: int) -> tuple[float, float]:
    """The Wald interval of (c - b) / n with the paired variance."""
    diff = (c - b) / n
    half = 1.959964 * math.sqrt(max((b + c) / n - diff * diff, 0.0) / n)
    return (diff - half, diff + half)


def coverage(p_a: float, p_b: float, p_both: float, *, n: int, draws: int, seed: int) -> dict[str, float]:
    """Share of simulated evaluations each interval covers p_b - p_a, and Tango's mean width."""
    cells = [p_both, p_a - p_both, p_b - p_both, 1 - p_a - p_b + p_both]
    counts = np.random.default_rng(seed).multinomial(n, cells, size=draws)
    truth = p_b - p_a
    hits = {"tango": 0, "conditional": 0, "wald": 0}
    width = 0.0
    for _, b, c, _ in counts.tolist():
        intervals = {
            "tango": stats.tango_interval(b, c, n, 0.05),
            "conditional": conditional_interval(b, c, n),
            "wald": wald_interval(b, c, n),
        }
        for name, (low, high) in intervals.items():
            hits[name] += low - 1e-12 <= truth <= high + 1e-12
        width += intervals["tango"][1] - intervals["tango"][0]
    return {name: count / draws for name, count in hits.items()} | {"width": width / draws}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="examples per simulated evaluation")
    parser.add_argument("--draws", type=int, default=20000, help="simulated evaluations per scenario")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"95% intervals of B - A, n = {args.n}, {args.draws} draws per row, seed {args.seed}\n")
    print("| P(A right) | P(B right) | P(both) | true diff | Tango (rayft) | exact conditional | Wald | Tango width |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p_a, p_b, p_both in SCENARIOS:
        row = coverage(p_a, p_b, p_both, n=args.n, draws=args.draws, seed=args.seed)
        print(
            f"| {p_a:.2f} | {p_b:.2f} | {p_both:.2f} | {p_b - p_a:+.2f} | {row['tango']:.3f} | "
            f"{row['conditional']:.3f} | {row['wald']:.3f} | {row['width']:.3f} |"
        )


if __name__ == "__main__":
    main()
