"""Attention for training rows that hold several examples: SDPA run once per example.

Training batches carry ``position_ids`` that restart at 0 for every example (packing, and the
right-padding block; see :mod:`rayft.data.collate`). With plain ``sdpa`` transformers turns that
into a block-diagonal mask over the whole row, so a 1024-token row packed with eight 128-token
examples computes 1024 x 1024 attention scores and throws seven eighths away. The per-example
implementation registered here slices each row at the position restarts and runs causal SDPA on
each example alone: the same result (the masked scores never contribute), with attention cost
that grows with each example's length instead of the row's, and no mask to build.

The bounds come from ``cu_seq_lens_q`` when the batch passes the variable-length kwargs (see
:meth:`rayft.data.collate.MicroBatch.varlen_kwargs`), from the position restarts otherwise.

It is a training-only implementation: it refuses a key/value cache, an attention mask, or a model
that does not hand ``position_ids`` to its attention layers (most transformers decoders do).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

from rayft.models.loading import loaded_attention

PER_EXAMPLE_SDPA = "sdpa_per_example"

# Per process: the last forward pass's position_ids and their example bounds.
_STATE: dict[str, tuple[torch.Tensor, list[list[tuple[int, int]]]] | None] = {"bounds": None}


def training_attention(attn_implementation: str, device_type: str) -> str:
    """The attention implementation a training model uses, given the configured one and the device.

    ``sdpa`` on CPU becomes the per-example variant (the block-diagonal mask would make packed
    rows pay quadratic attention over the whole row). On GPUs ``sdpa`` stays as configured: the
    per-example loop launches a kernel per example and layer, and ``flash_attention_2`` already
    gives variable-length attention there. Other implementations are kept. ``auto`` (a caller that did
    not plan the step: :mod:`rayft.training.modeling.step_choice`) stands for ``sdpa``.
    """
    attn_implementation = loaded_attention(attn_implementation)
    if attn_implementation == "sdpa" and device_type == "cpu":
        return PER_EXAMPLE_SDPA
    return attn_implementation


def uses_varlen(attn_implementation: str) -> bool:
    """Whether the implementation is a variable-length kernel that takes the examples' bounds
    (``cu_seq_lens_q/k``, ``max_length_q/k``): flash attention, Hub kernels (which transformers
    runs through its flash-attention path) and the per-example SDPA of CPU training."""
    return (
        attn_implementation.startswith("flash_attention")
        or "/" in attn_implementation
        or (attn_implementation == PER_EXAMPLE_SDPA)
    )


FLEX_BLOCK = 128
"""flex_attention's block size: rows padded to a multiple of it always take its main kernel."""


def row_multiple(attn_implementation: str) -> int:
    """The multiple that training rows are right-padded to for this attention implementation.

    flex_attention lowers a query shorter than one block (128 tokens) to its decoding kernel, which
    torch's inductor cannot build for training (fp32 or grouped-query heads: "NoValidChoicesError:
    flex_decoding", seen on an H100 with torch 2.11); rows of whole blocks take the training kernel
    and also match the block mask's granularity. The padding forms its own block with labels -100,
    so the loss is unchanged (see :mod:`rayft.data.collate`). Other kernels take rows as they are.
    """
    return FLEX_BLOCK if attn_implementation == "flex_attention" else 1


@functools.cache
def register() -> None:
    """Make :data:`PER_EXAMPLE_SDPA` a valid ``attn_implementation`` in this process (once)."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    # Left out of torch.compile (train.compile): its loop over the examples of a row reads their bounds as
    # Python ints, which compiled code would specialise on, compiling again for every batch.
    AttentionInterface.register(PER_EXAMPLE_SDPA, torch.compiler.disable(per_example_sdpa))  # type: ignore[no-untyped-call]
    # Masks as for flash attention: none without padding, else the 2D padding mask (which
    # per_example_sdpa refuses rather than ignores).
    ALL_MASK_ATTENTION_FUNCTIONS.register(PER_EXAMPLE_SDPA, flash_attention_mask)


def use_training_attention(net: PreTrainedModel, attn_implementation: str, device_type: str) -> None:
    """Switch a loaded model to the attention :func:`training_attention` picks (a no-op when unchanged).

    Models whose attention is more than causal softmax (a sliding window, logit soft-capping) keep
    their configured implementation.
    """
    chosen = training_attention(attn_implementation, device_type)
    attn_implementation = loaded_attention(attn_implementation)
    config = net.config.get_text_config() if hasattr(net.config, "get_text_config") else net.config
    special = getattr(config, "sliding_window", None) or getattr(config, "attn_logit_softcapping", None)
    if chosen == attn_implementation or special:
        return
    register()
    net.set_attn_implementation(chosen)


@contextlib.contextmanager
def generation_attention(net: torch.nn.Module, attn_implementation: str) -> Iterator[None]:
    """Inside the block, a training model whose attention is the per-example variant (which refuses a
    cache and a mask) generates with the configured implementation; the variant is back after it."""
    get_base_model = getattr(net, "get_base_model", None)  # a PEFT model's
    base = cast("PreTrainedModel", get_base_model() if get_base_model is not None else net)
    current = getattr(base.config, "_attn_implementation", None)
    if current != PER_EXAMPLE_SDPA:
        yield
        return
    base.set_attn_implementation(loaded_attention(attn_implementation))
    try:
        yield
    finally:
        base.set_attn_implementation(PER_EXAMPLE_SDPA)


def example_bounds(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """For each row, the ``[start, end)`` of every example: one starts wherever the position does
    not continue the previous token's (``position_ids[i] != position_ids[i - 1] + 1``)."""
    import torch

    width = int(position_ids.shape[1])
    breaks = (position_ids[:, 1:] != position_ids[:, :-1] + 1).cpu()
    bounds = []
    for row in breaks:
        starts = [0, *(torch.nonzero(row).flatten() + 1).tolist()]
        bounds.append(list(zip(starts, [*starts[1:], width], strict=True)))
    return bounds


def _cached_bounds(position_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """:func:`example_bounds`, computed once per forward pass (every layer sees the same tensor)."""
    last = _STATE["bounds"]
    if last is None or last[0] is not position_ids:
        last = _STATE["bounds"] = (position_ids, example_bounds(position_ids))
    return last[1]


def _bounds_from_offsets(cu_seq_lens: torch.Tensor, query: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per-row example bounds from the offsets of variable-length attention (rows laid end to end;
    no example crosses a row), read once per forward pass."""
    last = _STATE["bounds"]
    if last is not None and last[0] is cu_seq_lens:
        return last[1]
    width = int(query.shape[2])
    offsets = [int(o) for o in cu_seq_lens.tolist()]
    bounds: list[list[tuple[int, int]]] = [[] for _ in range(int(query.shape[0]))]
    for start, end in itertools.pairwise(offsets):
        row = start // width
        if (end - 1) // width != row:
            raise RuntimeError(f"cu_seq_lens_q puts an example across rows {row} and {(end - 1) // width}: {offsets}")
        bounds[row].append((start - row * width, end - row * width))
    _STATE["bounds"] = (cu_seq_lens, bounds)
    return bounds


def per_example_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,  # the layer's forward arguments, of many types (position_ids, cu_seq_lens_q, flags)
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: causal SDPA over each example of each row.

    Shapes as transformers passes them: query ``[batch, heads, seq, dim]``, key and value
    ``[batch, kv_heads, seq, dim]``; returns ``[batch, seq, heads, dim]`` like ``sdpa``.
    """
    import torch
    from torch.nn import functional

    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise RuntimeError(
            f"{type(module).__name__} does not pass position_ids to its attention, which "
            f"{PER_EXAMPLE_SDPA!r} needs to find the examples of a row; set model.attn_implementation=eager"
        )
    if attention_mask is not None or query.shape[2] != key.shape[2]:
        raise RuntimeError(
            f"{PER_EXAMPLE_SDPA!r} is for training without a cache or attention mask; load the model with "
            "attn_implementation='sdpa' to generate"
        )
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    rows = []
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    every_bounds = _cached_bounds(position_ids) if cu_seq_lens is None else _bounds_from_offsets(cu_seq_lens, query)
    for row, bounds in enumerate(every_bounds):
        pieces = [
            functional.scaled_dot_product_attention(
                query[row : row + 1, :, start:end],
                key[row : row + 1, :, start:end],
                value[row : row + 1, :, start:end],
                dropout_p=dropout,
                scale=scaling,
                is_causal=True,
                enable_gqa=gqa,
            )
            for start, end in bounds
        ]
        rows.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2))
    output = rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)
    return output.transpose(1, 2).contiguous(), None
