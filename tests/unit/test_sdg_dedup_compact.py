"""The compact near-duplicate index decides exactly as a bucket per exact band (the index it
replaced, kept here as the oracle), on the GSM8K questions and their renumbered and reworded copies."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from rayft.sdg.dedup import MinHashLSH
from tests.conftest import GSM8K_TRAIN


class DictIndex:
    """The reference: signatures in a list, one Python list of rows per (band, band bytes)."""

    def __init__(self, compact: MinHashLSH) -> None:
        self.compact = compact  # for its permutations (the signature is shared)
        self.buckets: dict[tuple[int, bytes], list[int]] = {}
        self.signatures: list[np.ndarray] = []
        self.groups: list[str] = []

    def find_or_add(self, text: str, group: str) -> int | None:
        sig = self.compact.signature(text)
        rows = self.compact.rows
        keys = [(band, sig[band * rows : (band + 1) * rows].tobytes()) for band in range(self.compact.bands)]
        seen: set[int] = set()
        for key in keys:
            for index in self.buckets.get(key, ()):
                if index in seen or self.groups[index] == group:
                    continue
                seen.add(index)
                if float(np.mean(self.signatures[index] == sig)) >= self.compact.threshold:
                    return index
        self.signatures.append(sig)
        self.groups.append(group)
        for key in keys:
            self.buckets.setdefault(key, []).append(len(self.signatures) - 1)
        return None


def _questions(limit: int) -> list[str]:
    if not GSM8K_TRAIN.exists():
        pytest.skip(f"{GSM8K_TRAIN} is not available")
    with GSM8K_TRAIN.open() as lines:
        return [json.loads(line)["question"] for _, line in zip(range(limit), lines, strict=False)]


def _stream(questions: list[str]) -> list[tuple[str, str]]:
    """Each question, a renumbered copy and a copy with one word dropped, under shuffled seeds."""
    rng = random.Random(7)
    texts = []
    for i, q in enumerate(questions):
        words = q.split()
        dropped = " ".join(words[: len(words) // 2] + words[len(words) // 2 + 1 :])
        renumbered = "".join(str(rng.randint(1, 99)) if c.isdigit() else c for c in q)
        texts += [(q, f"s{i}"), (renumbered, f"s{rng.randint(0, i)}"), (dropped, f"s{rng.randint(0, i)}")]
    rng.shuffle(texts)
    return texts


@pytest.mark.parametrize(("threshold", "num_perm", "bands"), [(0.8, 128, 32), (0.5, 64, 16)])
def test_the_compact_index_decides_as_the_dict_index(threshold: float, num_perm: int, bands: int) -> None:
    compact = MinHashLSH(threshold=threshold, num_perm=num_perm, bands=bands, shingle_words=3)
    oracle = DictIndex(MinHashLSH(threshold=threshold, num_perm=num_perm, bands=bands, shingle_words=3))
    decisions = [(compact.find_or_add(t, g), oracle.find_or_add(t, g)) for t, g in _stream(_questions(1500))]
    assert [c for c, _ in decisions] == [o for _, o in decisions]
    kept = sum(1 for c, _ in decisions if c is None)
    assert 1500 < kept < 4500  # near duplicates found, and not everything judged one
    assert compact.size == kept


def test_the_index_takes_under_a_kibibyte_per_row_at_the_defaults() -> None:
    index = MinHashLSH(threshold=0.8, num_perm=128, bands=32, shingle_words=3)
    for i in range(8192):  # two full blocks of signatures
        index.add(f"problem {i} about item{i} and item{i * 7} sold at stall{i % 13}", f"s{i}")
    assert index.size == 8192
    assert index.nbytes / index.size <= 4 * 128 + 12 * 32 + 8 <= 1024
