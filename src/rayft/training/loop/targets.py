"""The forward pass of the objectives that score each row's target tokens (preference pairs, RL completions).

Logits are computed only at the target positions some row trains on (``logits_to_keep``: prompts skip the
vocabulary projection). A micro-batch that carries its rows packed (:class:`rayft.data.collate.PackedRows`)
runs the model on the rows laid end to end, each sequence's positions restarting at 0, so no token of
padding is computed; the scores are then laid back into the padded rows' layout
(:func:`rayft.data.collate.unpack_targets`), which the losses read whichever way the forward ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from rayft.data.collate import unpack_targets
from rayft.data.prepared import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from rayft.data.collate import MicroBatch

# Per-position scores of the kept logits ``(rows, kept, vocab)`` and their targets ``(rows, kept)``, each
# ``(rows, kept)``: what the objective reads of each target token (its log-probability, an entropy).
Score = Callable[["torch.Tensor", "torch.Tensor"], "tuple[torch.Tensor, ...]"]


def kept_positions(labels: torch.Tensor) -> torch.Tensor:
    """The target positions (of ``labels[:, 1:]``) at which some row has a labelled token."""
    return (labels[:, 1:] != IGNORE_INDEX).any(dim=0).nonzero().flatten()


def target_scores(
    model: torch.nn.Module, rows: MicroBatch, autocast_dtype: torch.dtype | None, score: Score
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """``score`` of the model's logits at the rows' kept target positions (:func:`kept_positions`), each
    ``(rows, kept)`` in the padded rows' layout, and the targets there (-100 where a row trains on none)."""
    layout = kept_positions(rows.labels)
    targets = rows.labels[:, 1:][:, layout]
    packed = rows.packed
    if packed is None:
        return score(_kept_logits(model, rows, layout, autocast_dtype), targets), targets
    kept = kept_positions(packed.row.labels)
    values = score(_kept_logits(model, packed.row, kept, autocast_dtype), packed.row.labels[:, 1:][:, kept])
    return tuple(unpack_targets(value, kept, packed, layout) for value in values), targets


def _kept_logits(
    model: torch.nn.Module, rows: MicroBatch, keep: torch.Tensor, autocast_dtype: torch.dtype | None
) -> torch.Tensor:
    import torch

    autocast = (
        torch.autocast(device_type=rows.input_ids.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with autocast:
        logits: torch.Tensor = model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False,
                                     logits_to_keep=keep).logits  # fmt: skip
    return logits
