"""Turning training units (see :mod:`rayft.data.prepared`) into model inputs.

Every micro-batch is passed as ``input_ids`` + ``position_ids`` with no attention mask: positions
restart at 0 for every example, so transformers builds a block-diagonal causal mask (sdpa, eager,
flex_attention). Right padding forms its own block with labels -100, so padded and packed batches
go through one code path and padding never changes a real token's logits.

Variable-length kernels (flash attention) take the examples' bounds instead of a mask: the
micro-batch also carries them as transformers' padding-free path expects (:meth:`MicroBatch.varlen_kwargs`),
over the batch's rows laid end to end, computed here on the host so that the forward pass never
waits on the device to find them. ``max_length`` is rounded up to a power of two (at most the row
width): ``torch.compile`` specialises on a Python int, so exact per-batch maxima would compile
the blocks again for every new value, while powers of two give a handful of values in all.

A preference or RL micro-batch may also carry its rows laid end to end (:class:`PackedRows`, ``collate(...,
packed=True)``): the forward pass runs on that one row, and each value per target position is laid back
into the padded rows' layout (:func:`unpack_targets`), where the objectives' losses read it. The padded
rows are then only a layout (their tokens are never computed), so the loss code is the same either way.

An encoder-decoder's micro-batch (:func:`collate_pairs`) is padded the usual way instead: the sources
right-padded with an ``attention_mask``, the targets right-padded with -100 to their own width; the
model makes its decoder input from the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayft.data.prepared import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


@dataclass
class PackedRows:
    """A micro-batch's rows laid end to end as one row (``row``, positions restarting per sequence), and
    where each padded target position lands in it: ``targets[r, t]`` is the index in ``row``'s targets
    (``labels[:, 1:]``) of row ``r``'s target ``t``, or -1 past the row's end."""

    row: MicroBatch
    targets: torch.Tensor

    def to(self, device: Any) -> PackedRows:
        """The same rows with their tensors on ``device``."""
        return PackedRows(self.row.to(device), self.targets.to(device))


@dataclass
class MicroBatch:
    """Model inputs of one micro-batch, plus the counts the loss and the metrics need."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    num_tokens: int
    num_label_tokens: int
    sample_ids: list[int]
    cu_seq_lens: torch.Tensor | None = None
    max_length: int = 0
    attention_mask: torch.Tensor | None = None  # an encoder-decoder's source padding (see collate_pairs)
    packed: PackedRows | None = None  # the rows laid end to end, which the forward pass runs on instead

    @property
    def seq2seq(self) -> bool:
        """Whether this is an encoder-decoder's batch: sources in ``input_ids``, targets in ``labels``."""
        return self.attention_mask is not None

    def varlen_kwargs(self) -> dict[str, Any]:
        """The examples' bounds for variable-length attention: ``cu_seq_lens_q/k`` (int32 offsets of
        every example, and of the padding block, in the rows laid end to end) and ``max_length_q/k``."""
        if self.cu_seq_lens is None:
            self.cu_seq_lens, self.max_length = sequence_bounds(self.position_ids)
        return {
            "cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length, "max_length_k": self.max_length,
        }  # fmt: skip

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the model computes, padding included (an encoder-decoder's: sources and targets)."""
        if self.packed is not None:
            return self.packed.row.num_computed_tokens
        return int(self.input_ids.numel()) + (int(self.labels.numel()) if self.seq2seq else 0)

    def to(self, device: Any) -> MicroBatch:
        """The same batch with its tensors on ``device``."""
        return MicroBatch(
            self.input_ids.to(device),
            self.labels.to(device),
            self.position_ids.to(device),
            self.num_tokens,
            self.num_label_tokens,
            self.sample_ids,
            None if self.cu_seq_lens is None else self.cu_seq_lens.to(device),
            self.max_length,
            None if self.attention_mask is None else self.attention_mask.to(device),
            None if self.packed is None else self.packed.to(device),
        )


def collate(
    units: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int = 1, *, seq2seq: bool = False,
    packed: bool = False,
) -> MicroBatch:  # fmt: skip
    """Right-pad units to a common length (a multiple of ``pad_to_multiple_of``) and stack them
    (an encoder-decoder's units with ``seq2seq``: see :func:`collate_pairs`); with ``packed``, the batch
    also carries the units laid end to end (:func:`pack_rows`), for the forward pass."""
    if seq2seq:
        return collate_pairs(units, pad_token_id)
    rows = pad_rows(units, pad_token_id, pad_to_multiple_of)
    if packed:
        rows.packed = pack_rows(units, pad_token_id, pad_to_multiple_of, int(rows.input_ids.shape[1]))
    return rows


def pad_rows(units: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int) -> MicroBatch:
    """Units right-padded to a common length (a multiple of ``pad_to_multiple_of``) and stacked."""
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
    cu_seq_lens, max_length = sequence_bounds(positions)
    return MicroBatch(input_ids, labels, positions, num_tokens, num_label_tokens, sample_ids, cu_seq_lens, max_length)


def end_to_end(units: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The units laid end to end as one unit: a padding-free micro-batch of one row. Each example keeps
    its own positions (restarting at 0), so attention that reads the examples' bounds computes what it
    computes over padded rows, and no position is spent on padding."""
    merged: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "sample_ids": []}
    for unit in units:
        for key, values in merged.items():
            values.extend(unit[key])
    return merged


def pack_rows(units: Sequence[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int, width: int) -> PackedRows:
    """The units (one sequence each) laid end to end in one row, and where each target of their padded
    rows (``width`` wide) lands in it.

    Every sequence's first label is set to -100 in the row: in the padded rows it is never a target (no
    token predicts it), while end to end the previous sequence's last token would predict it.
    """
    import torch

    starts = []
    offset = 0
    firsts = []
    for unit in units:
        starts.append(offset)
        offset += len(unit["input_ids"])
        firsts.append({**unit, "labels": [IGNORE_INDEX, *list(unit["labels"])[1:]]})
    row = pad_rows([end_to_end(firsts)], pad_token_id, pad_to_multiple_of)
    targets = torch.full((len(units), max(width - 1, 0)), -1, dtype=torch.long)
    for index, (unit, start) in enumerate(zip(units, starts, strict=True)):
        # Target t of a row predicts its token t + 1 from token t: both in the sequence, at start + t.
        n = len(unit["input_ids"]) - 1
        targets[index, :n] = torch.arange(start, start + n, dtype=torch.long)
    return PackedRows(row, targets)


def unpack_targets(values: torch.Tensor, kept: torch.Tensor, packed: PackedRows, layout: torch.Tensor) -> torch.Tensor:
    """Values computed at the packed row's target positions ``kept`` (``values``: ``(1, len(kept))``) laid out
    as the padded rows' target positions ``layout`` (``(rows, len(layout))``, 0 where a row has none).
    Differentiable: the gradient flows back to ``values``."""
    import torch

    width = int(packed.row.labels.shape[1]) - 1
    flat = torch.zeros(width, dtype=values.dtype, device=values.device).index_put((kept,), values[0])
    where = packed.targets[:, layout]
    inside = where >= 0
    return torch.where(inside, flat[where.clamp(min=0)], torch.zeros((), dtype=values.dtype, device=values.device))


def collate_pairs(units: Sequence[dict[str, Any]], pad_token_id: int) -> MicroBatch:
    """An encoder-decoder's micro-batch: sources right-padded with ``pad_token_id`` and an attention
    mask, targets right-padded with -100 (no loss, and the model's decoder input sees its pad token)."""
    import torch

    source_width = max(len(u["input_ids"]) for u in units)
    target_width = max(len(u["labels"]) for u in units)
    input_ids = torch.full((len(units), source_width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(units), source_width), dtype=torch.long)
    labels = torch.full((len(units), target_width), IGNORE_INDEX, dtype=torch.long)
    for row, unit in enumerate(units):
        n, m = len(unit["input_ids"]), len(unit["labels"])
        input_ids[row, :n] = torch.tensor(unit["input_ids"], dtype=torch.long)
        mask[row, :n] = 1
        labels[row, :m] = torch.tensor(unit["labels"], dtype=torch.long)
    positions = torch.arange(source_width, dtype=torch.long).repeat(len(units), 1)
    sample_ids = [int(s) for u in units for s in u["sample_ids"]]
    return MicroBatch(
        input_ids, labels, positions, num_tokens=sum(int(u["num_tokens"]) for u in units),
        num_label_tokens=int((labels != IGNORE_INDEX).sum()), sample_ids=sample_ids, attention_mask=mask,
    )  # fmt: skip


def sequence_bounds(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Offsets (int32, starting at 0, ending at the token count) of every example in the rows of
    ``position_ids`` laid end to end (an example starts wherever the position does not continue the
    previous token's, so every row starts one), and the longest example's length rounded up to a
    power of two, capped at the row width."""
    import torch

    flat = position_ids.reshape(-1).cpu()
    starts = torch.nonzero(flat[1:] != flat[:-1] + 1).flatten() + 1
    total = torch.tensor([flat.numel()])
    cu_seq_lens = torch.cat([torch.zeros(1, dtype=torch.long), starts, total]).to(torch.int32)
    longest = int(cu_seq_lens.diff().max()) if flat.numel() else 0
    bucket = 1 << max(longest - 1, 0).bit_length()
    return cu_seq_lens.to(position_ids.device), min(bucket, int(position_ids.shape[-1]))
