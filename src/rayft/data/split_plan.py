"""Which rows become training and validation examples: a pure planner over row counts and weights
(no rows, no tokenizer), unit-tested on its own.

Every decision comes from a seeded hash of the row's key (its dataset's position and its row
number), never from a random generator walked in order: whether a row is held out, whether it gets
an extra copy in a mixture, and where it lands in the training order. A row's fate is therefore the
same however the rows are cut into blocks or spread over workers; what is shared is one threshold
per dataset (:func:`holdout_threshold`), computed from the row count alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

_MASK = (1 << 64) - 1
HOLDOUT, EXTRA_COPY, ORDER = 1, 2, 3  # what a hash decides; each its own stream


@dataclass(frozen=True)
class Record:
    """One example to prepare: its sample id, split, and the row it comes from."""

    sample_id: int
    split: str
    source: int
    row: int


def _mix64(value: int) -> int:
    """splitmix64's finaliser on one Python int (the scalar twin of :func:`_mix64_array`)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _mix64_array(values: np.ndarray) -> np.ndarray:
    import numpy as np

    # uint64 arithmetic on arrays wraps modulo 2**64, as splitmix64 wants.
    values = values + np.uint64(0x9E3779B97F4A7C15)
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = values ^ (values >> np.uint64(31))
    return mixed


def row_hashes(seed: int, purpose: int, source: int, rows: np.ndarray, copy: int = 0) -> np.ndarray:
    """The 64-bit hash of each row number in ``rows`` of dataset ``source``, for one ``purpose``.

    A bijection of the row number for fixed (seed, purpose, source, copy): rows of a dataset never
    share a hash, and a row's hash does not depend on the other rows of its block.
    """
    import numpy as np

    base = _mix64(seed & _MASK)
    for part in (purpose, source, copy):
        base = _mix64(base ^ part)
    return _mix64_array(rows.astype(np.uint64) ^ np.uint64(base))


def holdout_threshold(seed: int, source: int, size: int, fraction: float) -> int:
    """The hash below which a row of a ``size``-row dataset is held out: exactly
    ``round(size * fraction)`` rows fall under it."""
    import numpy as np

    cut = round(size * fraction)
    if cut == 0:
        return 0
    hashes = row_hashes(seed, HOLDOUT, source, np.arange(size, dtype=np.uint64))
    if cut >= size:
        return 1 << 64
    return int(np.partition(hashes, cut)[cut])


def held_out(seed: int, source: int, rows: np.ndarray, threshold: int) -> np.ndarray:
    """Which of ``rows`` (row numbers, any block of them) are held out for validation."""
    import numpy as np

    if threshold >= 1 << 64:
        return np.ones(len(rows), dtype=bool)
    return row_hashes(seed, HOLDOUT, source, rows) < np.uint64(threshold)


@dataclass(frozen=True)
class Plan:
    """Every example to prepare, in sample-id order, as arrays (16 bytes an example): the dataset
    (``sources``) and row (``rows``) each comes from; the first ``num_train`` are training examples."""

    sources: np.ndarray
    rows: np.ndarray
    num_train: int

    def __len__(self) -> int:
        return len(self.rows)

    def split_of(self, sample_id: int) -> str:
        """The split an example belongs to."""
        return "train" if sample_id < self.num_train else "validation"


def plan_records(
    sizes: Sequence[int], weights: Sequence[float], *, train_sources: int, validation_fraction: float, seed: int
) -> list[Record]:
    """:func:`plan_examples` as one :class:`Record` per example (for small data and tests)."""
    plan = plan_examples(sizes, weights, train_sources=train_sources, validation_fraction=validation_fraction,
                         seed=seed)  # fmt: skip
    return [
        Record(i, plan.split_of(i), int(s), int(r))
        for i, (s, r) in enumerate(zip(plan.sources.tolist(), plan.rows.tolist(), strict=True))
    ]


def plan_examples(
    sizes: Sequence[int], weights: Sequence[float], *, train_sources: int, validation_fraction: float, seed: int
) -> Plan:
    """Which rows become training and validation examples, in order (a pure planner).

    The first ``train_sources`` sources are training data: each first holds out
    ``validation_fraction`` of its rows (when no validation source follows), then contributes
    rows in proportion to its weight (each row ``want // rows`` times, and the rows with the
    smallest extra-copy hashes once more); the training examples are ordered by hash. Sample ids
    number training then validation examples.
    """
    import numpy as np

    held = len(sizes) == train_sources
    pools: list[np.ndarray] = []
    validation: list[tuple[int, np.ndarray]] = []
    for source, size in enumerate(sizes):
        rows = np.arange(size, dtype=np.int64)
        if source >= train_sources:
            validation.append((source, rows))
            continue
        threshold = holdout_threshold(seed, source, size, validation_fraction) if held else 0
        out = held_out(seed, source, rows, threshold)
        validation.append((source, rows[out]))
        pools.append(rows[~out])
    train_sources_, train_rows = _mix(pools, weights[:train_sources], seed)
    sources = np.concatenate([train_sources_, *(np.full(len(r), s, dtype=np.int64) for s, r in validation)])
    rows = np.concatenate([train_rows, *(r for _, r in validation)])
    return Plan(sources.astype(np.int32), rows.astype(np.int64), len(train_rows))


def _mix(pools: list[np.ndarray], weights: Sequence[float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pool's rows repeated to its weight's share, all ordered by their ORDER hash: (sources, rows)."""
    import numpy as np

    total = sum(len(p) for p in pools)
    keys: list[np.ndarray] = []
    entries: list[tuple[int, np.ndarray]] = []
    for source, (pool, weight) in enumerate(zip(pools, weights, strict=True)):
        want = len(pool) if len(pools) == 1 else round(total * weight / sum(weights))
        if not len(pool):
            continue
        copies, extra = divmod(want, len(pool))
        order = np.argsort(row_hashes(seed, EXTRA_COPY, source, pool), kind="stable")
        for copy in range(copies + (1 if extra else 0)):
            rows = pool if copy < copies else np.sort(pool[order[:extra]])
            entries.append((source, rows))
            keys.append(row_hashes(seed, ORDER, source, rows, copy))
    if not entries:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    flat_sources = np.concatenate([np.full(len(rows), source, dtype=np.int64) for source, rows in entries])
    flat_rows = np.concatenate([rows for _, rows in entries])
    # Ties between datasets (distinct keys, equal hashes) are astronomically rare; (source, row) breaks them.
    order = np.lexsort((flat_rows, flat_sources, np.concatenate(keys)))
    return flat_sources[order], flat_rows[order]
