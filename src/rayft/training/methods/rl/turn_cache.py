"""The KV cache of a batch of episodes kept across their turns (``train.rl.environment.keep_kv_cache``).

The episodes of a micro-batch sample each turn in one ``generate`` call (:mod:`rayft.training.methods.rl.episodes`).
Without this, every turn prefills each conversation whole again: prompt, every turn so far and every answer.
With it, the batch's cache outlives the call: the next turn appends only what is new in each conversation (the
environment's answer, and the last sampled token, which ``generate`` never feeds back) and prefills that alone.

The cache's layout is one row per episode and, side by side, the columns of every call: the first call's
left-padded prompts, then per call its block of new tokens (left-padded to the block's longest) and its sampled
block (each row padded after its own end of sequence). Padding slots stay in the cache, masked out (attention
mask 0), and ``generate`` derives the position ids from the mask's running count, so every real token keeps the
position a fresh prefill of its conversation gives it and attends to the same keys: the logits equal a fresh
prefill's up to float rounding. The holes cost attention columns, never a wrong token.

transformers' own ``generate`` does the continuing (the installed 5.x continues from a given ``cache`` when the
input ids and the attention mask cover the whole layout, prefilling only the columns past the cache), so no
decoding loop is written here; this module only keeps the layout, the mask and the rows of the live episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from rayft.training.methods.rl.shared_prefix import left_padded

if TYPE_CHECKING:
    import torch
    from transformers import Cache, GenerationConfig

    from rayft.training.modeling.model import TransformersModel


@dataclass
class TurnCache:
    """A micro-batch's conversations in one KV cache between turns; ``prefilled`` counts, per row of the last
    call, the tokens its prefill computed (all of a conversation on a fresh start, its new tokens after)."""

    cache: Cache | None = None
    """transformers' ``DynamicCache`` of the layout's columns but the last (None before the first call)."""
    layout: torch.Tensor | None = None
    """Token ids, one row per live episode, padding included."""
    mask: torch.Tensor | None = None
    """1 where the layout holds a conversation's token, 0 on padding."""
    keys: list[int] = field(default_factory=list)
    """Which episode each row is."""
    lengths: list[int] = field(default_factory=list)
    """Each row's conversation tokens in the layout."""
    prefilled: list[int] = field(default_factory=list)

    def select(self, keys: list[int]) -> None:
        """Keep the rows of ``keys`` (the episodes still going, in order): the ended ones leave the cache."""
        import torch

        if self.cache is None or not set(keys) <= set(self.keys):
            self.drop()
        elif keys != self.keys:
            assert self.layout is not None and self.mask is not None
            index = torch.tensor([self.keys.index(k) for k in keys], device=self.layout.device)
            self.cache.batch_select_indices(index)
            self.layout, self.mask = self.layout[index], self.mask[index]
            self.lengths = [self.lengths[self.keys.index(k)] for k in keys]
        self.keys = list(keys)

    def drop(self) -> None:
        """Forget the cache: the next call prefills every conversation whole."""
        self.cache = self.layout = self.mask = None
        self.lengths = []

    def generate(
        self, inner: TransformersModel, rows: list[list[int]], config: GenerationConfig, pad: int,
        cut: Callable[[list[int]], list[int]],
    ) -> list[list[int]]:  # fmt: skip
        """One turn of each row (``rows[i]``: the conversation of ``keys[i]``), from the kept cache when it holds a
        prefix of every row, else from a fresh one; each turn cut after its end of sequence by ``cut``."""
        import torch

        device = next(inner.parameters()).device
        if self.cache is not None and not self.continues(rows):
            self.drop()  # a conversation changed under the cache (never by the runner): start again, never guess
        if self.cache is None:
            self.cache = fresh_cache(inner)
            self.layout = self.mask = torch.zeros((len(rows), 0), dtype=torch.long, device=device)
            self.lengths = [0] * len(rows)
        assert self.layout is not None and self.mask is not None
        cached = self.mask[:, : self.cache.get_seq_length()].sum(dim=1).tolist()
        block, block_mask = left_padded([row[n:] for row, n in zip(rows, self.lengths, strict=True)], pad, device)
        layout, mask = torch.cat([self.layout, block], dim=1), torch.cat([self.mask, block_mask], dim=1)
        config.return_dict_in_generate = True  # the call's own config: the sequences come back with the cache
        generate = cast("Callable[..., Any]", inner.generate)
        out = generate(input_ids=layout, attention_mask=mask, generation_config=config, cache=self.cache)
        width = layout.shape[1]
        turns = [cut(row) for row in out.sequences[:, width:].tolist()]
        sampled = [[1] * len(t) + [0] * (out.sequences.shape[1] - width - len(t)) for t in turns]
        self.layout = out.sequences
        self.mask = torch.cat([mask, torch.tensor(sampled, dtype=torch.long, device=device)], dim=1)
        self.prefilled = [len(row) - int(n) for row, n in zip(rows, cached, strict=True)]
        self.lengths = [len(row) + len(t) for row, t in zip(rows, turns, strict=True)]
        return turns

    def continues(self, rows: list[list[int]]) -> bool:
        """Whether every row's conversation starts with the tokens its layout row holds."""
        assert self.layout is not None and self.mask is not None
        if len(rows) != self.layout.shape[0]:
            return False
        kept = [r[m.bool()].tolist() for r, m in zip(self.layout, self.mask, strict=True)]
        return all(row[: len(k)] == k for row, k in zip(rows, kept, strict=True))


def fresh_cache(inner: TransformersModel) -> Cache:
    """An empty ``DynamicCache`` for ``inner``."""
    from transformers import DynamicCache

    return DynamicCache(config=inner.config)


def keeps_cache(inner: TransformersModel) -> bool:
    """Whether ``inner``'s cache can be kept across turns: every layer a full-attention layer. A sliding-window
    layer keeps the last columns of the layout, which its padding holes would shorten below the window, and a
    linear-attention (state-space) layer folds every column into its state, holes included."""
    from transformers.cache_utils import DynamicLayer

    layers = fresh_cache(inner).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
