"""The running batch of one replica: rows that join and leave between decoding steps, over the model's forward.

Every row keeps its keys and values in one left-padded :class:`~transformers.DynamicCache`
(``[rows, heads, positions, dim]``) with a 0/1 attention mask over its positions, and decodes at its
own position ids, as HF ``generate`` decodes a left-padded batch. Rows that leave are dropped between
steps (their cache rows are removed, and positions padded in every remaining row are cut). A step
decodes one token for every running row, prefills the rows that join, or both in one forward (a mixed
step); the joining rows' caches are then appended to the batch's, padded on the left to one length.
A PEFT model with adapters gets each row's adapter by name (``adapter_names``, PEFT's mixed-adapter
inference). Each row samples with its own settings and generator, from the raw logits' softmax.

A mixed step puts every new token of the step in the batch dimension, so the linear layers run once over
the running rows' next tokens and the joining prompts, with PEFT's ``adapter_names`` still picking each
token's adapter; its attention is :mod:`rayft.serving.mixed_step`'s. Why by hand: transformers' own mixed
layout (its continuous batching, batch dimension 1 over a paged cache) cannot take PEFT's per-row
adapters (the :mod:`rayft.serving.engine` docstring has the rest). On 2 CPUs a forward of
SmolLM2-135M costs about 50 ms before its first token, which a separate prefill step paid once more
per request (``docs/performance.md``). Mixed steps run for the model types of
:data:`~rayft.serving.mixed_step.MIXED_MODEL_TYPES` (Llama, Qwen, Mistral, Mixtral, Gemma, Phi, GPT-2, ...)
without sliding-window attention (:func:`~rayft.serving.mixed_step.mixes`); other models prefill in steps of
their own.

A joining row may bring a cached prefix of its prompt (:mod:`rayft.serving.prefix_cache`): only the rest of
its prompt is forwarded, at the positions after the prefix, attending over a copy of the prefix's keys and
values (a prefill step seeds its cache with them, left-padded like the rest; a mixed step's attention puts them
before the row's own keys). The keys and values a step computes for a joining row are handed back
(:attr:`RunningBatch.prefilled`), for the cache to keep.

Only decoder-only models whose cache layers are plain :class:`~transformers.cache_utils.DynamicLayer`
run here (Llama, Qwen2, Mistral without sliding window, GPT-2, ...): a sliding-window or hybrid cache
keeps per-layer offsets that padding rows together would break.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from rayft.serving.mixed_step import MixedStep, base_model, last_positions_only, mixed_attention_on, mixes
from rayft.serving.prefix_cache import Prefix
from rayft.serving.sampling import Sampler


@dataclass
class NewRow:
    """A row that joins the batch: its key, prompt ids, adapter (PEFT name) and sampler; with a cached
    ``prefix`` of its prompt (:mod:`rayft.serving.prefix_cache`), only the tokens after it are prefilled."""

    key: int
    input_ids: list[int]
    adapter: str
    sampler: Sampler
    top_logprobs: int | None = None  # None: no log-probabilities; 0: the chosen token's only
    prefix: Prefix | None = None
    keep: bool = False  # hand the keys and values of its prefilled tokens back (RunningBatch.prefilled)

    @property
    def cached(self) -> int:
        """Prompt tokens that come from the cached prefix, not from this step's forward."""
        return self.prefix.tokens if self.prefix is not None else 0


@dataclass
class Picked:
    """One row's new token at one step, with its log-probability and the top alternatives when asked."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class _Row:
    key: int
    adapter: str
    sampler: Sampler
    top_logprobs: int | None
    position: int  # position id of the row's next input token
    next_token: int


class RunningBatch:
    """Rows decoding together on one model; see the module docstring."""

    def __init__(self, model: Any, pad_token_id: int, device: str, *, adapters: bool = False, mixed: bool = True
                 ) -> None:  # fmt: skip
        self.model, self.pad, self.device = model, pad_token_id, device
        self.adapters = adapters  # whether the model is a PEFT model that takes adapter_names
        self.mixed = mixed  # whether joining rows prefill in the running rows' decoding step, where the model allows
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor = torch.zeros((0, 0), dtype=torch.long)
        self._cache_names: dict[int, str] = {}
        # Of the rows that joined at the last step and asked for it (NewRow.keep): each layer's keys and values
        # of the tokens that step prefilled (``[1, kv_heads, tokens, dim]``, views of the batch's cache).
        self.prefilled: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def width(self) -> int:
        """Positions the cache holds per row (the longest row's, the others padded to it)."""
        return int(self.mask.shape[1])

    def drop(self, keys: set[int]) -> None:
        """Remove rows (finished, or their client gone) and the positions no remaining row uses."""
        keep = [i for i, row in enumerate(self.rows) if row.key not in keys]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, torch.zeros((0, 0), dtype=torch.long)
            return
        index = torch.tensor(keep)
        self.mask = self.mask.index_select(0, index)
        used = int(self.mask.any(dim=0).long().argmax())  # the first position some row uses
        self.mask = self.mask[:, used:]
        index = index.to(self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, used:]
            layer.values = layer.values.index_select(0, index)[:, :, used:]

    def mixes(self) -> bool:
        """Whether rows that join prefill in the same forward as the running rows' next tokens (a mixed step)."""
        return self.mixed and mixes(self.model)

    def step(self, joining: list[NewRow]) -> dict[int, Picked]:
        """New tokens by key: one for every running row and the first of each joining row in a mixed step
        (:meth:`mixes`); else the joining rows' first tokens (a prefill step), or one for every running row.

        Without mixed steps a prefill step comes first, so that a new request's first token waits for its
        own prompt only, not also for a decoding step of the rows already running.
        """
        self.prefilled = {}
        with torch.inference_mode():
            if joining and self.rows and self.mixes():
                return self._mixed_step(joining)
            return self._prefill(joining) if joining else self._decode() if self.rows else {}

    def _decode(self) -> dict[int, Picked]:
        ids = torch.tensor([[row.next_token] for row in self.rows], device=self.device)
        positions = torch.tensor([[row.position] for row in self.rows], device=self.device)
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        logits = self._forward(ids, self.mask, positions, self.cache, [row.adapter for row in self.rows])
        out = self._pick(logits, self.rows)
        for row in self.rows:
            row.position += 1
            row.next_token = out[row.key].token
        return out

    def _prefill(self, joining: list[NewRow]) -> dict[int, Picked]:
        """The joining rows' prompts, left-padded to one length after their cached prefixes (themselves
        left-padded to the longest prefix: ``[pad, prefix, pad, rest of the prompt]`` per row)."""
        from transformers import DynamicCache

        rest = [r.input_ids[r.cached :] for r in joining]
        longest, before = max(len(ids) for ids in rest), max(r.cached for r in joining)
        ids = torch.tensor([[self.pad] * (longest - len(r)) + r for r in rest])
        mask = torch.tensor([[0] * (before - r.cached) + [1] * r.cached + [0] * (longest - len(tokens))
                             + [1] * len(tokens) for r, tokens in zip(joining, rest, strict=True)])  # fmt: skip
        tail = mask[:, before:]
        offsets = torch.tensor([[r.cached] for r in joining])
        positions = (tail.cumsum(-1) - 1 + offsets).masked_fill_(tail == 0, 1)  # as generate places a padded batch
        cache = DynamicCache()
        cache.layer_class_to_replicate = _spare_layer_class()  # the model adds one layer per decoder layer
        if before:
            _seed(cache, [r.prefix for r in joining], before)
        rows = [_Row(r.key, r.adapter, r.sampler, r.top_logprobs, len(r.input_ids), 0) for r in joining]
        logits = self._forward(ids.to(self.device), mask.to(self.device), positions.to(self.device), cache,
                               [r.adapter for r in joining])  # fmt: skip
        out = self._pick(logits, rows)
        for row in rows:
            row.next_token = out[row.key].token
        layers = _checked_layers(cache)
        for index, (new, tokens) in enumerate(zip(joining, rest, strict=True)):
            if new.keep:
                start = mask.shape[1] - len(tokens)
                self.prefilled[new.key] = [(k[index : index + 1, :, start:], v[index : index + 1, :, start:])
                                           for k, v in layers]  # fmt: skip
        if not self.rows:
            self.rows, self.cache, self.mask = rows, cache, mask
        else:
            self._append(rows, layers, mask)
        return out

    def _mixed_step(self, joining: list[NewRow]) -> dict[int, Picked]:
        ids, positions = [row.next_token for row in self.rows], [row.position for row in self.rows]
        adapters, segments = [row.adapter for row in self.rows], []
        for new in joining:
            segments.append((len(ids), len(new.input_ids) - new.cached))
            ids += new.input_ids[new.cached :]
            positions += range(new.cached, len(new.input_ids))
            adapters += [new.adapter] * (len(new.input_ids) - new.cached)
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        plan = MixedStep(len(self.rows), segments, list(self.cache.layers),
                         self.mask.to(self.device, torch.bool)[:, None, None, :],
                         [r.prefix for r in joining])  # fmt: skip
        last = [*range(len(self.rows)), *(start + length - 1 for start, length in segments)]
        kwargs: dict[str, Any] = {"adapter_names": adapters} if self.adapters else {}
        with mixed_attention_on(self.model), last_positions_only(self.model, last) as selected:
            out = self.model(input_ids=torch.tensor(ids, device=self.device)[:, None], use_cache=False,
                             position_ids=torch.tensor(positions, device=self.device)[:, None], logits_to_keep=1,
                             rayft_mixed=plan, **kwargs)  # fmt: skip
        if len(plan.joined) != len(plan.layers):
            raise RuntimeError(
                f"{len(plan.joined)} of this model's {len(plan.layers)} attention layers ran rayft's mixed step; "
                "set serve.mixed_steps: false"
            )
        logits: torch.Tensor = out.logits[:, -1, :] if selected else out.logits[last, -1, :]
        rows = [_Row(r.key, r.adapter, r.sampler, r.top_logprobs, len(r.input_ids), 0) for r in joining]
        picked = self._pick(logits, [*self.rows, *rows])
        for row in [*self.rows, *rows]:
            row.next_token = picked[row.key].token
        for row in self.rows:
            row.position += 1
        lengths = [len(new.input_ids) for new in joining]
        longest = max(lengths)
        mask = torch.tensor([[0] * (longest - length) + [1] * length for length in lengths])
        for index, new in enumerate(joining):
            if new.keep:
                self.prefilled[new.key] = [(k[:, :, new.cached :], v[:, :, new.cached :])
                                           for k, v in (parts[index] for parts in plan.joined)]  # fmt: skip
        self._append(rows, [_right_aligned(parts, longest) for parts in plan.joined], mask)
        return picked

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any,
                 adapters: list[str]) -> torch.Tensor:  # fmt: skip
        """The last position's logits of each row (``[rows, vocab]``); ``cache`` grows in place."""
        kwargs: dict[str, Any] = {"adapter_names": adapters} if self.adapters else {}
        if id(self.model) not in self._cache_names:  # the model changes once, when a PEFT model wraps it
            self._cache_names[id(self.model)] = _cache_argument(self.model)
        kwargs[self._cache_names[id(self.model)]] = cache
        out = self.model(input_ids=ids, attention_mask=mask.to(self.device), position_ids=positions, use_cache=True,
                         logits_to_keep=1, **kwargs)  # fmt: skip
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def _pick(self, logits: torch.Tensor, rows: list[_Row]) -> dict[int, Picked]:
        greedy = logits.argmax(dim=-1).tolist()
        wanted = any(row.top_logprobs is not None for row in rows)
        logprobs = torch.log_softmax(logits.float(), dim=-1) if wanted else None
        out: dict[int, Picked] = {}
        for index, row in enumerate(rows):
            token = greedy[index] if row.sampler.plain_greedy else row.sampler.pick(logits[index])
            row.sampler.taken(token)
            out[row.key] = Picked(token)
            if logprobs is not None and row.top_logprobs is not None:
                out[row.key].logprob = float(logprobs[index, token])
                if row.top_logprobs:
                    values, ids = logprobs[index].topk(row.top_logprobs)
                    out[row.key].top = list(zip(ids.tolist(), values.tolist(), strict=True))
        return out

    def _append(self, rows: list[_Row], layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Join the prefilled rows (their keys and values per layer, left-padded among themselves to ``mask``'s
        width) to the running batch, both padded on the left to the longer width."""
        width = max(self.width(), int(mask.shape[1]))
        for old, (keys, values) in zip(self.cache.layers, layers, strict=True):
            old.keys = _stack_right_aligned(old.keys, keys, width)
            old.values = _stack_right_aligned(old.values, values, width)
        self.mask = _stack_right_aligned(self.mask, mask, width)
        self.rows = [*self.rows, *rows]


def _stack_right_aligned(old: torch.Tensor, new: torch.Tensor, width: int) -> torch.Tensor:
    """``old``'s rows, then ``new``'s, each ending at position ``width`` (dim 2 of a cache layer, dim 1 of a
    mask) with zeros before: one allocation and one copy of each, where padding each and then
    concatenating would copy the running rows' cache twice."""
    dim = 2 if old.dim() == 4 else 1
    shape = list(old.shape)
    shape[0], shape[dim] = old.shape[0] + new.shape[0], width
    out = old.new_zeros(shape)
    out[: old.shape[0]].narrow(dim, width - old.shape[dim], old.shape[dim]).copy_(old)
    out[old.shape[0] :].narrow(dim, width - new.shape[dim], new.shape[dim]).copy_(new)
    return out


def _right_aligned(parts: list[tuple[torch.Tensor, torch.Tensor]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's keys and values of the rows that joined (each ``[1, heads, length, dim]``) as one tensor
    each, every row ending at position ``width`` with zeros before (one row: as it is)."""
    if len(parts) == 1 and parts[0][0].shape[2] == width:
        return parts[0]
    out = []
    for which in (0, 1):
        first = parts[0][which]
        stacked = first.new_zeros((len(parts), first.shape[1], width, first.shape[3]))
        for index, part in enumerate(parts):
            stacked[index, :, width - part[which].shape[2] :].copy_(part[which][0])
        out.append(stacked)
    return out[0], out[1]


def _cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache by: ``cache`` (transformers 5.x, most models), or
    ``past_key_values`` (deprecated there, still the only one of some model classes)."""
    import inspect

    base = base_model(model)
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


SPARE_POSITIONS = 32
"""Positions a cache layer allocates ahead of its rows' keys and values, so that decoding steps append
their one position each in place; ``DynamicLayer`` concatenates, copying the whole layer at every step
(about an eighth of a 16-row decoding step of SmolLM2-135M on 2 CPUs)."""


@functools.cache
def _spare_layer_class() -> type:
    """:class:`~transformers.cache_utils.DynamicLayer`, appending into spare positions (made once: transformers
    is imported late)."""
    from transformers.cache_utils import DynamicLayer

    class SpareLayer(DynamicLayer):  # type: ignore[no-untyped-call]
        """A DynamicLayer whose keys and values are views of a larger tensor, filled position by position."""

        spare_keys: torch.Tensor | None = None
        spare_values: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
            keys, values = self.keys, self.values
            if not self.is_initialized or keys is None or values is None or keys.numel() == 0:
                return super().update(key_states, value_states, *args, **kwargs)
            length, end = int(keys.shape[2]), int(keys.shape[2] + key_states.shape[2])
            spare_keys, spare_values = self.spare_keys, self.spare_values
            if spare_keys is None or spare_values is None or not _prefix_of(keys, spare_keys) or (
                    end > spare_keys.shape[2]):  # fmt: skip
                # The batch replaced keys and values (rows joined or left), or the spare positions ran out.
                spare_keys, spare_values = _with_spare(keys, end), _with_spare(values, end)
                self.spare_keys, self.spare_values = spare_keys, spare_values
            spare_keys[:, :, length:end].copy_(key_states)
            spare_values[:, :, length:end].copy_(value_states)
            self.keys, self.values = spare_keys[:, :, :end], spare_values[:, :, :end]
            return spare_keys[:, :, :end], spare_values[:, :, :end]

    return SpareLayer


def _with_spare(tensor: torch.Tensor, needed: int) -> torch.Tensor:
    """A tensor of ``tensor``'s shape with room for ``needed`` positions and :data:`SPARE_POSITIONS` more (dim 2),
    ``tensor`` at its start (``needed``: more than one more where a prefill extends a cached prefix)."""
    shape = list(tensor.shape)
    shape[2] = needed + SPARE_POSITIONS
    out = tensor.new_empty(shape)
    out[:, :, : tensor.shape[2]].copy_(tensor)
    return out


def _prefix_of(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether ``view`` is ``base``'s first positions (``base[:, :, :n]``)."""
    return (
        view.data_ptr() == base.data_ptr() and view.stride() == base.stride()
        and view.shape[:2] == base.shape[:2] and view.shape[3] == base.shape[3]
    )  # fmt: skip


def _seed(cache: Any, prefixes: list[Prefix | None], width: int) -> None:
    """Fill an empty cache with the rows' cached prefixes, each ending at position ``width`` (zeros before, and
    in the rows without one): a copy, as the cache's layers grow and change in place."""
    template = next(p.kv for p in prefixes if p is not None)
    layers, _, heads, _, dim = template.shape
    kv = template.new_zeros((layers, 2, len(prefixes), heads, width, dim))
    for row, prefix in enumerate(prefixes):
        if prefix is not None:
            kv[:, :, row, :, width - prefix.tokens :].copy_(prefix.kv)
    for index in range(layers):
        cache.update(kv[index, 0], kv[index, 1], index)


def _checked_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of a prefill step's cache, once its layers are known to pad together."""
    from transformers.cache_utils import DynamicLayer

    allowed = (DynamicLayer, _spare_layer_class())
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) not in allowed}
    if kinds:
        raise RuntimeError(
            f"this model's KV cache has {', '.join(sorted(kinds))} layers, which continuous batching in rayft "
            "serve does not pad together; serve it with serve.backend: vllm, or a model without sliding-window "
            "attention"
        )
    return [(layer.keys, layer.values) for layer in cache.layers]
