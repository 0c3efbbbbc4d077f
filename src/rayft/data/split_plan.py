"""Which rows become training and validation examples: a pure planner over row counts and weights
(no rows, no tokenizer), unit-tested on its own."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    """One example to prepare: its sample id, split, and the row it comes from."""

    sample_id: int
    split: str
    source: int
    row: int


def plan_records(
    sizes: Sequence[int], weights: Sequence[float], *, train_sources: int, validation_fraction: float, seed: int
) -> list[Record]:
    """Which rows become training and validation examples, in order (a pure planner).

    The first ``train_sources`` sources are training data: each first holds out
    ``validation_fraction`` of its rows (when no validation source follows), then contributes
    rows in proportion to its weight (sampling without replacement, repeating when a weight asks
    for more rows than it has); the mixture is shuffled by ``seed``. Sample ids number training
    then validation examples.
    """
    rng = random.Random(seed)
    held_out = len(sizes) == train_sources
    train_pool: list[list[tuple[int, int]]] = []
    validation: list[tuple[int, int]] = []
    for source, size in enumerate(sizes):
        rows = [(source, r) for r in range(size)]
        if source >= train_sources:
            validation.extend(rows)
            continue
        rng.shuffle(rows)
        cut = round(size * validation_fraction) if held_out else 0
        validation.extend(sorted(rows[:cut]))
        train_pool.append(rows[cut:])
    train = _mix(train_pool, weights[:train_sources], rng)
    return [Record(i, "train", s, r) for i, (s, r) in enumerate(train)] + [
        Record(len(train) + i, "validation", s, r) for i, (s, r) in enumerate(validation)
    ]


def _mix(pools: list[list[tuple[int, int]]], weights: Sequence[float], rng: random.Random) -> list[tuple[int, int]]:
    if len(pools) == 1:
        return pools[0]
    total = sum(len(p) for p in pools)
    mixed: list[tuple[int, int]] = []
    for pool, weight in zip(pools, weights, strict=True):
        want = round(total * weight / sum(weights))
        if pool:
            copies, extra = divmod(want, len(pool))
            mixed.extend(pool * copies + rng.sample(pool, extra))
    rng.shuffle(mixed)
    return mixed
