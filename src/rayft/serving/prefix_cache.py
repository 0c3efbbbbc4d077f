"""A bounded cache of prompt prefixes' keys and values, so that requests sharing a prefix prefill it once.

A prompt is cut into blocks of :data:`BLOCK_TOKENS` tokens. Each full block's keys and values (every layer's,
one tensor ``[layers, 2, kv_heads, BLOCK_TOKENS, head_dim]``) are kept under a digest of the block's tokens
and of every token before it (a chain of SHA-256 digests, as vLLM's automatic prefix caching hashes its
blocks), and under the adapter that computed them: a LoRA adapter's keys and values differ from the base
model's, so a block serves only requests of the same adapter (the key holds the adapter's id and source).
A new request's prompt takes the longest run of cached blocks from its start, but never its last token,
whose logits the prefill must compute; only the rest of the prompt is prefilled, attending over a copy of
the cached keys and values (:mod:`rayft.serving.batch`).

Why whole blocks from the start: a block's keys and values depend on every token before it, so a digest of
the whole prefix is what makes a block reusable; aligning on blocks bounds the lookups per prompt and the
entries per prefix. Why no per-row sharing of the tensors: the running batch pads and appends its rows'
caches (and writes into them in place), so each joining row takes its own copy; the copy is one memory
read of the prefix against its prefill's forward pass.

The cache holds at most ``budget_tokens`` tokens; past it, the least recently used blocks go first. A hit
touches its blocks from the last to the first, so that within a prefix the deepest blocks are evicted
before the blocks they extend (a block whose parent is gone can no longer be reached). Not thread-safe by
itself: the engine calls it under its own lock, or between steps.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BLOCK_TOKENS = 16
"""Tokens per cached block: vLLM's default block size. Smaller blocks reuse more of a prefix that ends
mid-block, at more entries and lookups per prompt."""


@dataclass(frozen=True)
class Prefix:
    """A cached prompt prefix for one joining row: its length and its keys and values
    (``[layers, 2, kv_heads, tokens, head_dim]``, one tensor the row reads from)."""

    tokens: int
    kv: torch.Tensor

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values, each ``[1, kv_heads, tokens, head_dim]``."""
        return self.kv[index, 0][None], self.kv[index, 1][None]


@dataclass
class PrefixCacheStats:
    """What the cache has done: prompt tokens looked up and found, requests that found a prefix, tokens held."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    hit_requests: int = 0
    cached_tokens: int = 0
    evicted_blocks: int = 0

    def hit_rate(self) -> float:
        """The share of the prompt tokens looked up that came from the cache (0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def block_digests(ids: list[int]) -> list[bytes]:
    """The chained digest of each full block of ``ids``: block ``i``'s covers tokens ``[0, (i + 1) * BLOCK_TOKENS)``."""
    digests, parent = [], b""
    for end in range(BLOCK_TOKENS, len(ids) + 1, BLOCK_TOKENS):
        parent = hashlib.sha256(parent + array("q", ids[end - BLOCK_TOKENS : end]).tobytes()).digest()
        digests.append(parent)
    return digests


class PrefixCache:
    """Blocks of prompt prefixes' keys and values, least recently used out first; see the module docstring."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_blocks = budget_tokens // BLOCK_TOKENS
        self.blocks: collections.OrderedDict[tuple[str, bytes], torch.Tensor] = collections.OrderedDict()
        self.stats = PrefixCacheStats()

    def cached_tokens(self, adapter: str, digests: list[bytes], prompt_tokens: int) -> int:
        """How many of a prompt's tokens a lookup would find now (nothing touched or counted)."""
        return self._found(adapter, digests, prompt_tokens) * BLOCK_TOKENS

    def lookup(self, adapter: str, digests: list[bytes], prompt_tokens: int) -> Prefix | None:
        """The longest cached prefix of a prompt (of ``prompt_tokens`` tokens, its blocks' ``digests``) under
        ``adapter``, short of its last token; counted, and its blocks made the most recently used."""
        import torch

        found = self._found(adapter, digests, prompt_tokens)
        self.stats.queried_tokens += prompt_tokens
        if not found:
            return None
        keys = [(adapter, digest) for digest in digests[:found]]
        self._touch(keys)
        self.stats.hit_tokens += found * BLOCK_TOKENS
        self.stats.hit_requests += 1
        return Prefix(found * BLOCK_TOKENS, torch.cat([self.blocks[key] for key in keys], dim=3))

    def store(self, adapter: str, digests: list[bytes], start: int, layers: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> None:  # fmt: skip
        """Keep the full blocks of a prompt just prefilled from token ``start`` (a multiple of the block size):
        ``layers`` holds each layer's keys and values of the tokens from ``start`` on (``[1, kv_heads, n, dim]``)."""
        import torch

        if not self.budget_blocks or not layers or len({k.shape[1:] for k, _ in layers}) > 1:
            return  # off, or layers of different shapes (one tensor per block cannot hold them)
        first = start // BLOCK_TOKENS
        for index in range(first, len(digests)):
            key = (adapter, digests[index])
            if key in self.blocks:
                continue
            begin = index * BLOCK_TOKENS - start
            part = [torch.stack((k[0, :, begin : begin + BLOCK_TOKENS], v[0, :, begin : begin + BLOCK_TOKENS]))
                    for k, v in layers]  # fmt: skip
            self.blocks[key] = torch.stack(part)  # a copy: the batch's cache tensors change in place
        self._touch([(adapter, digest) for digest in digests])
        self._evict()

    def forget(self, adapter: str) -> None:
        """Drop every block computed under ``adapter`` (its weights changed, or it is no longer served)."""
        for key in [key for key in self.blocks if key[0] == adapter]:
            del self.blocks[key]
        self.stats.cached_tokens = len(self.blocks) * BLOCK_TOKENS

    def _found(self, adapter: str, digests: list[bytes], prompt_tokens: int) -> int:
        """Blocks from the prompt's start that are cached, leaving its last token to prefill."""
        found = 0
        for digest in digests[: (prompt_tokens - 1) // BLOCK_TOKENS]:
            if (adapter, digest) not in self.blocks:
                break
            found += 1
        return found

    def _touch(self, keys: list[tuple[str, bytes]]) -> None:
        for key in reversed(keys):  # the first block ends the most recent: leaves are evicted before roots
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def _evict(self) -> None:
        while len(self.blocks) > self.budget_blocks:
            self.blocks.popitem(last=False)
            self.stats.evicted_blocks += 1
        self.stats.cached_tokens = len(self.blocks) * BLOCK_TOKENS
