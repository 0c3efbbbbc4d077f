"""Duplicate and leak detection for generated rows: exact hashes, MinHash LSH, n-gram overlap.

All three compare questions. Exact duplicates use the normalised text (case and spacing folded).
Near duplicates and evaluation leaks mask numbers first, so two problems that differ only in
their numbers count as the same wording. The near-duplicate index is compact numpy arrays (under
1 KiB per kept row at the defaults), fed row by row on the driver, so the decision for a row never
depends on how Ray split the data into batches.
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


def exact_key(text: str) -> int:
    """A stable 64-bit hash of the normalised text (the first 8 bytes of its SHA-1)."""
    return int.from_bytes(hashlib.sha1(normalize(text).encode()).digest()[:8], "big")


def words(text: str, *, mask_numbers: bool) -> list[str]:
    """Lower-cased word and punctuation tokens; numbers become '<n>' when masked."""
    tokens = _WORD.findall(text.lower())
    return ["<n>" if mask_numbers and _NUMBER.fullmatch(t) else t for t in tokens]


def ngrams(tokens: list[str], n: int) -> set[str]:
    """Word n-grams joined by spaces; a text shorter than n is one n-gram."""
    if len(tokens) <= n:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constants of a multiplicative hash
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)
_PENDING_ROWS = 1024  # rows whose bucket keys wait in a dict before joining the sorted arrays
_SIGNATURE_BLOCK = 4096  # rows per block of stored signatures


class MinHashLSH:
    """Near-duplicate index: MinHash signatures of word shingles, banded LSH buckets.

    A new text is a near duplicate when some indexed text from another group (a seed) shares an
    LSH bucket with it and their signatures agree on at least ``threshold`` of the permutations
    (an estimate of the Jaccard similarity of their shingle sets).

    The index is compact, about ``4 * num_perm + 12 * bands + 8`` bytes per row (904 at the
    defaults): signatures as 32-bit integers in fixed blocks, each band of a row as one 64-bit key
    in one sorted array beside its row number (a few recent rows wait in a small dict), and a
    64-bit hash of each row's group. Two bands whose keys collide only add a candidate, which the signature
    comparison then judges, so the decisions are those of a bucket per exact band.
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
        self.size = 0
        self._blocks: list[np.ndarray] = []  # signatures, _SIGNATURE_BLOCK rows of uint32 each
        self._groups = np.zeros(0, dtype=np.int64)  # a 64-bit hash of each row's group
        self._keys = np.zeros(0, dtype=np.uint64)  # sorted; equal keys in row order
        self._owners = np.zeros(0, dtype=np.int32)  # the row of each key
        self._pending: dict[int, list[int]] = {}  # key -> rows, for rows not yet merged
        self._pending_rows = 0

    def signature(self, text: str) -> np.ndarray:
        """The MinHash signature of the number-masked word shingles of ``text``."""
        shingles = ngrams(words(text, mask_numbers=True), self.shingle_words) or {""}
        x = np.fromiter((zlib.crc32(s.encode()) % _PRIME for s in shingles), dtype=np.int64, count=len(shingles))
        hashed = (np.outer(self._a, x) + self._b[:, None]) % _PRIME
        result: np.ndarray = hashed.min(axis=1)
        return result

    def find(self, text: str, group: str) -> int | None:
        """The index of an indexed near duplicate from another group, or None."""
        return self._match(self.signature(text), group)

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

    @property
    def nbytes(self) -> int:
        """Bytes held by the index's arrays (signatures, bucket keys, rows, groups)."""
        arrays = [*self._blocks, self._groups, self._keys, self._owners]
        return sum(a.nbytes for a in arrays)

    def _band_keys(self, sig: np.ndarray) -> np.ndarray:
        """One 64-bit key per band: the band number and the band's values, mixed."""
        values = sig.astype(np.uint64).reshape(self.bands, self.rows)
        keys = (np.arange(self.bands, dtype=np.uint64) + np.uint64(1)) * _MIX
        for column in range(self.rows):
            keys = (keys ^ values[:, column]) * _MIX2
            keys ^= keys >> np.uint64(31)
        return keys

    def _signature_of(self, index: int) -> np.ndarray:
        block, row = divmod(index, _SIGNATURE_BLOCK)
        signature: np.ndarray = self._blocks[block][row]
        return signature

    def _candidates(self, keys: np.ndarray) -> list[list[int]]:
        """Per band, the rows sharing its key: older (merged) rows first, each in row order."""
        lows = np.searchsorted(self._keys, keys, side="left")
        highs = np.searchsorted(self._keys, keys, side="right")
        return [
            [*self._owners[low:high].tolist(), *self._pending.get(key, ())]
            for key, low, high in zip(keys.tolist(), lows.tolist(), highs.tolist(), strict=True)
        ]

    def _match(self, sig: np.ndarray, group: str) -> int | None:
        seen: set[int] = set()
        number = _group_hash(group)
        for bucket in self._candidates(self._band_keys(sig)):
            for index in bucket:
                if index in seen or self._groups[index] == number:
                    continue
                seen.add(index)
                if float(np.mean(self._signature_of(index) == sig)) >= self.threshold:
                    return index
        return None

    def _insert(self, sig: np.ndarray, group: str) -> None:
        index = self.size
        block, row = divmod(index, _SIGNATURE_BLOCK)
        if block == len(self._blocks):
            self._blocks.append(np.zeros((_SIGNATURE_BLOCK, sig.shape[0]), dtype=np.uint32))
            self._groups = np.concatenate([self._groups, np.zeros(_SIGNATURE_BLOCK, dtype=np.int64)])
        self._blocks[block][row] = sig
        self._groups[index] = _group_hash(group)
        for key in self._band_keys(sig).tolist():
            self._pending.setdefault(key, []).append(index)
        self.size += 1
        self._pending_rows += 1
        if self._pending_rows >= _PENDING_ROWS:
            self._merge()

    def _merge(self) -> None:
        """Move the pending keys into the sorted arrays, after the equal keys already there."""
        pairs = sorted((key, index) for key, rows in self._pending.items() for index in rows)
        keys = np.fromiter((k for k, _ in pairs), dtype=np.uint64, count=len(pairs))
        owners = np.fromiter((i for _, i in pairs), dtype=np.int32, count=len(pairs))
        at = np.searchsorted(self._keys, keys, side="right")
        self._keys = np.insert(self._keys, at, keys)
        self._owners = np.insert(self._owners, at, owners)
        self._pending.clear()
        self._pending_rows = 0


def _group_hash(group: str) -> int:
    return int.from_bytes(hashlib.blake2b(group.encode(), digest_size=8).digest(), "big", signed=True)


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
