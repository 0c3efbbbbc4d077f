"""Turning training units (see :mod:`rayft.data.prepared`) into model inputs.

Every micro-batch is passed as ``input_ids`` + ``position_ids`` with no attention mask: positions
restart at 0 for every example, so transformers builds a block-diagonal causal mask (sdpa, eager)
or uses variable-length kernels (flash attention). Right padding forms its own block with labels
-100, so padded and packed batches go through one code path and padding never changes a real
token's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayft.data.prepared import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


@dataclass
class MicroBatch:
    """Model inputs of one micro-batch, plus the counts the loss and the metrics need."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    num_tokens: int
    num_label_tokens: int
    sample_ids: list[int]

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the model computes, padding included."""
        return int(self.input_ids.numel())

    def to(self, device: Any) -> MicroBatch:
        """The same batch with its tensors on ``device``."""
        return MicroBatch(
            self.input_ids.to(device),
            self.labels.to(device),
            self.position_ids.to(device),
            self.num_tokens,
            self.num_label_tokens,
            self.sample_ids,
        )


def collate(units: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int = 1) -> MicroBatch:
    """Right-pad units to a common length (a multiple of ``pad_to_multiple_of``) and stack them."""
    import torch

    longest = max(len(u["input_ids"]) for u in units)
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(units), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(units), width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.arange(width, dtype=torch.long).repeat(len(units), 1)
    sample_ids: list[int] = []
    for row, unit in enumerate(units):
        n = len(unit["input_ids"])
        input_ids[row, :n] = torch.tensor(unit["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.tensor(unit["labels"], dtype=torch.long)
        positions[row, :n] = torch.tensor(unit["position_ids"], dtype=torch.long)
        positions[row, n:] = torch.arange(width - n, dtype=torch.long)
        sample_ids.extend(int(s) for s in unit["sample_ids"])
    num_tokens = sum(len(u["input_ids"]) for u in units)
    num_label_tokens = int((labels != IGNORE_INDEX).sum())
    return MicroBatch(input_ids, labels, positions, num_tokens, num_label_tokens, sample_ids)
