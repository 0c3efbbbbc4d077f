"""A group of completions of one prompt sampled from one prefill of it (``train.rl.rollout.shared_prefix``).

``generate`` over ``group`` copies of each prompt would prefill every copy: the prompt's forward pass is done
``group`` times. Here the prompts of a micro-batch (left-padded) are forwarded once, up to their last token;
the KV cache is repeated ``group`` times along the batch (copy ``j`` of prompt ``i`` at row ``i * group + j``,
the order of the unshared rows) and handed to ``generate``, which forwards only the last prompt token of each
row and then decodes as usual. The logits of every step are those of the unshared call up to float rounding,
and no random number is drawn in the prefill, so a seeded call samples from the same random stream.

transformers' ``generate`` takes a prefilled cache but has no way to share one prompt among several
continuations without repeating it, hence this small prefill of our own.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from transformers import Cache

    from rayft.training.modeling.model import TransformersModel


@cache
def cache_argument() -> str:
    """The name transformers gives the KV cache in ``forward``, ``generate`` and model outputs: ``cache`` since
    it renamed ``past_key_values`` (5.x releases accept either name, the old one with a warning)."""
    from transformers import GenerationMixin

    parameters = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def left_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` left-padded with ``pad`` to the longest, and the mask of their tokens (shape (rows, 0) when every
    row is empty: a turn with nothing new to prefill)."""
    import torch

    width = max((len(r) for r in rows), default=0)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids.reshape(len(rows), width), mask.reshape(len(rows), width)


def prefilled(inner: TransformersModel, input_ids: torch.Tensor, attention: torch.Tensor, group: int) -> Cache:
    """The KV cache of every prompt token but the last (which ``generate`` forwards itself), computed once per
    prompt and repeated ``group`` times along the batch. Positions follow the attention mask as ``generate``
    numbers them (a left-padded prompt starts at 0)."""
    positions = (attention.long().cumsum(-1) - 1).masked_fill(attention == 0, 0)
    name = cache_argument()
    out = inner(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                use_cache=True, logits_to_keep=1)  # fmt: skip
    kv: Cache = getattr(out, name)
    kv.batch_repeat_interleave(group)
    return kv


def generate_shared(
    inner: TransformersModel, input_ids: torch.Tensor, attention: torch.Tensor, group: int, **kwargs: Any
) -> torch.Tensor:
    """``inner.generate`` over ``group`` consecutive copies of each (left-padded) row, the rows prefilled once;
    ``kwargs`` go to ``generate`` as they are. Rows of one token have nothing to share: they are generated
    as the copies would be."""
    rows = input_ids.repeat_interleave(group, dim=0)
    mask = attention.repeat_interleave(group, dim=0)
    generate = cast("Callable[..., torch.Tensor]", inner.generate)  # the token ids (no dict asked for)
    if input_ids.shape[1] < 2:
        return generate(input_ids=rows, attention_mask=mask, **kwargs)
    kv = prefilled(inner, input_ids, attention, group)
    return generate(input_ids=rows, attention_mask=mask, **{cache_argument(): kv}, **kwargs)
