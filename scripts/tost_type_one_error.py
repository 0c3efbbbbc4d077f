"""Type-I error by simulation of the equivalence test (TOST) ``rayft compare`` runs at a margin.

    .venv/bin/python scripts/tost_type_one_error.py [--draws 40000] [--boot-draws 3000] [--seed 3]

Each scenario puts the true difference B - A exactly on the margin, where "not equivalent" still holds,
and counts how often the test declares equivalence at alpha = 0.05: that share is the test's type-I
error there, which should not exceed 0.05. Accuracies (Tango's score test at each end of the margin)
are drawn as outcome pairs (P(A right), P(B right), P(both right)); a continuous metric (the paired
bootstrap's TOST, 500 resamples) as uniform scores plus the margin plus normal noise. Prints a Markdown
table; seeded, so it reproduces.
"""

from __future__ import annotations

import argparse

import numpy as np

from rayft.evaluation import stats

# (P(A right), P(B right), P(both right), examples, margin): the difference P(B) - P(A) is +-margin.
BINARY = [
    (0.3, 0.35, 0.25, 400, 0.05),
    (0.5, 0.6, 0.45, 200, 0.1),
    (0.5, 0.4, 0.35, 200, 0.1),
    (0.3, 0.2, 0.1, 100, 0.1),
    (0.1, 0.15, 0.1, 200, 0.05),
]
# (examples, margin, noise sd) of a continuous metric.
CONTINUOUS = [(60, 0.1, 0.4), (200, 0.05, 0.3)]


def binary_rate(scenario: tuple[float, float, float, int, float], draws: int, seed: int) -> float:
    """Share of simulated evaluations of ``scenario`` (a row of :data:`BINARY`) that Tango's TOST finds equivalent."""
    p_a, p_b, p_both, n, margin = scenario
    cells = [p_both, p_a - p_both, p_b - p_both, 1 - p_a - p_b + p_both]
    counts = np.random.default_rng(seed).multinomial(n, cells, size=draws)
    return sum(stats.tango_tost(int(a), int(b), n, margin, 0.05).equivalent for _, a, b, _ in counts) / draws


def continuous_rate(scenario: tuple[int, float, float], draws: int, seed: int) -> float:
    """Share of simulated evaluations of ``scenario`` (a row of :data:`CONTINUOUS`) that the paired bootstrap's
    TOST finds equivalent."""
    n, margin, sd = scenario
    rng = np.random.default_rng(seed)
    found = 0
    for draw in range(draws):
        a = rng.random(n)
        b = a + margin + rng.normal(0, sd, n)
        found += stats.paired_bootstrap_test(a, b, samples=500, seed=draw, margins=(margin,)).equivalence[0].equivalent
    return found / draws


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=40000)
    parser.add_argument("--boot-draws", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    print("| metric | scenario | examples | margin | equivalence declared (alpha 0.05) |")
    print("|---|---|---:|---:|---:|")
    for p_a, p_b, p_both, n, margin in BINARY:
        rate = binary_rate((p_a, p_b, p_both, n, margin), args.draws, args.seed)
        print(f"| accuracy | P(A) {p_a}, P(B) {p_b}, P(both) {p_both} | {n} | {margin} | {rate:.4f} |")
    for n, margin, sd in CONTINUOUS:
        rate = continuous_rate((n, margin, sd), args.boot_draws, args.seed)
        print(f"| continuous | uniform + margin + N(0, {sd}) | {n} | {margin} | {rate:.4f} |")


if __name__ == "__main__":
    main()
