"""Duplicate and leak detection for generated rows: exact hashes, MinHash LSH, n-gram overlap.

All three compare questions. Exact duplicates use the normalised text (case and spacing folded).
Near duplicates and evaluation leaks mask numbers first, so two problems that differ only in
their numbers count as the same wording. The indexes are plain Python and numpy, fed row by row
on the driver, so the decision for a row never depends on how Ray split the data into batches.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable

import numpy as np

_WORD = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*|[^\sa-z\d]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_PRIME = (1 << 31) - 1


def normalize(text: str) -> str:
    """Lower case with runs of whitespace folded to one space."""
    return " ".join(text.lower().split())


def exact_key(text: str) -> str:
    """A stable hash of the normalised text."""
    return hashlib.sha1(normalize(text).encode()).hexdigest()


def words(text: str, *, mask_numbers: bool) -> list[str]:
    """Lower-cased word and punctuation tokens; numbers become '<n>' when masked."""
    tokens = _WORD.findall(text.lower())
    return ["<n>" if mask_numbers and _NUMBER.fullmatch(t) else t for t in tokens]


def ngrams(tokens: list[str], n: int) -> set[str]:
    """Word n-grams joined by spaces; a text shorter than n is one n-gram."""
    if len(tokens) <= n:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class MinHashLSH:
    """Near-duplicate index: MinHash signatures of word shingles, banded LSH buckets.

    A new text is a near duplicate when some indexed text from another group (a seed) shares an
    LSH bucket with it and their signatures agree on at least ``threshold`` of the permutations
    (an estimate of the Jaccard similarity of their shingle sets).
    """

    def __init__(self, *, threshold: float, num_perm: int, bands: int, shingle_words: int, seed: int = 1) -> None:
        if num_perm % bands:
            raise ValueError(f"num_perm ({num_perm}) must be a multiple of bands ({bands})")
        rng = np.random.default_rng(seed)
        self._a = rng.integers(1, _PRIME, size=num_perm, dtype=np.int64)
        self._b = rng.integers(0, _PRIME, size=num_perm, dtype=np.int64)
        self.threshold = threshold
        self.bands = bands
        self.rows = num_perm // bands
        self.shingle_words = shingle_words
        self._buckets: dict[tuple[int, bytes], list[int]] = {}
        self._signatures: list[np.ndarray] = []
        self._groups: list[str] = []

    def signature(self, text: str) -> np.ndarray:
        """The MinHash signature of the number-masked word shingles of ``text``."""
        shingles = ngrams(words(text, mask_numbers=True), self.shingle_words) or {""}
        x = np.fromiter((zlib.crc32(s.encode()) % _PRIME for s in shingles), dtype=np.int64, count=len(shingles))
        hashed = (np.outer(self._a, x) + self._b[:, None]) % _PRIME
        result: np.ndarray = hashed.min(axis=1)
        return result

    def find(self, text: str, group: str) -> int | None:
        """The index of an indexed near duplicate from another group, or None."""
        sig = self.signature(text)
        return self._match(sig, group)

    def add(self, text: str, group: str) -> None:
        """Index ``text`` as a member of ``group``."""
        self._insert(self.signature(text), group)

    def find_or_add(self, text: str, group: str) -> int | None:
        """Index ``text`` unless it is a near duplicate; returns the duplicate's index in that case."""
        sig = self.signature(text)
        match = self._match(sig, group)
        if match is None:
            self._insert(sig, group)
        return match

    def _band_keys(self, sig: np.ndarray) -> Iterable[tuple[int, bytes]]:
        for band in range(self.bands):
            yield band, sig[band * self.rows : (band + 1) * self.rows].tobytes()

    def _match(self, sig: np.ndarray, group: str) -> int | None:
        seen: set[int] = set()
        for key in self._band_keys(sig):
            for index in self._buckets.get(key, ()):
                if index in seen or self._groups[index] == group:
                    continue
                seen.add(index)
                if float(np.mean(self._signatures[index] == sig)) >= self.threshold:
                    return index
        return None

    def _insert(self, sig: np.ndarray, group: str) -> None:
        index = len(self._signatures)
        self._signatures.append(sig)
        self._groups.append(group)
        for key in self._band_keys(sig):
            self._buckets.setdefault(key, []).append(index)


class NgramIndex:
    """Evaluation problems as a set of word n-grams; a text that shares one with them has leaked."""

    def __init__(self, texts: Iterable[str], *, n: int, mask_numbers: bool) -> None:
        self.n = n
        self.mask_numbers = mask_numbers
        self._grams: set[str] = set()
        self.num_texts = 0
        for text in texts:
            self._grams |= ngrams(words(text, mask_numbers=mask_numbers), n)
            self.num_texts += 1

    def overlap(self, text: str) -> str | None:
        """The first shared n-gram (for the rejection report), or None when the text is clean."""
        for gram in ngrams(words(text, mask_numbers=self.mask_numbers), self.n):
            if gram in self._grams:
                return gram
        return None
