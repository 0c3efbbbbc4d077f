"""The frozen token embedding and output head of a QLoRA base, stored quantized by bitsandbytes.

bitsandbytes' ``from_pretrained`` integration quantizes the linear layers only. On a small model the
embedding is a large share of the weights (SmolLM2-135M's 49152 x 576 table is a fifth of them), so
``lora.quantize_embeddings`` stores it in the same 4-bit NF4 or 8-bit form. A model whose head is tied
to its embedding keeps them tied: one quantized table serves both the lookup and the head's matmul.
The table is only ever read; a merged export merges the adapter into the base loaded as saved.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from rayft.errors import ModelError

_BLOCK = 64  # NF4 block size: one float32 absmax per 64 values (bitsandbytes' default)


class QuantizedTable(nn.Module):
    """A frozen (vocabulary x width) matrix stored as NF4 (packed two values a byte, a float32 absmax
    per block of 64) or int8 (a float32 scale per row), read back in the dtype it was loaded in.

    Called with token ids it is the input embedding; :class:`QuantizedHead` multiplies by it.
    """

    packed: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor, kind: Literal["nf4", "int8"]) -> None:
        from bitsandbytes import functional as bnb

        super().__init__()
        self.kind = kind
        self.shape = tuple(weight.shape)
        self.dtype = weight.dtype
        if kind == "nf4":
            packed, state = bnb.quantize_4bit(weight.detach(), blocksize=_BLOCK, quant_type="nf4")
            scales = state.absmax
        else:  # LLM.int8()'s row-wise absmax rounding (bitsandbytes' CUDA kernel for it takes float16 alone)
            scales = weight.detach().float().abs().amax(dim=1)
            packed = torch.round(weight.detach().float() * (127.0 / scales.clamp_min(1e-12)).unsqueeze(1))
            packed = packed.to(torch.int8)
        # Buffers: they move with the model and count as its memory, and no optimizer or adapter sees them.
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)

    @property
    def num_embeddings(self) -> int:
        """Rows (vocabulary size), as ``nn.Embedding`` names them (``resize_token_embeddings`` reads it)."""
        return self.shape[0]

    @property
    def embedding_dim(self) -> int:
        """Columns (hidden width), as ``nn.Embedding`` names them."""
        return self.shape[1]

    def dequantized(self) -> torch.Tensor:
        """The whole matrix in the dtype it was loaded in."""
        if self.kind == "nf4":
            whole: torch.Tensor = torch.ops.bitsandbytes.dequantize_4bit.default(
                self.packed, self.scales, _BLOCK, "nf4", self.shape, self.dtype
            )
            return whole
        return (self.packed.float() * (self.scales.unsqueeze(1) / 127.0)).to(self.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``input_ids``."""
        if self.kind == "int8":  # per-row scales: dequantize only the rows looked up
            rows = nn.functional.embedding(input_ids, self.packed).float()
            return (rows * (self.scales[input_ids].unsqueeze(-1) / 127.0)).to(self.dtype)
        return nn.functional.embedding(input_ids, self.dequantized())


class _FrozenMatmul(torch.autograd.Function):
    """``hidden @ table.T`` with gradients for ``hidden`` only, the table dequantized in the forward
    and again in the backward rather than kept between them (a full-width copy of the table for the
    whole step would undo the saving)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, table: QuantizedTable) -> torch.Tensor:
        ctx.table = table
        return hidden @ table.dequantized().to(hidden.dtype).T

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad @ ctx.table.dequantized().to(grad.dtype), None


class QuantizedHead(nn.Module):
    """The output head as a product with a :class:`QuantizedTable` (the embedding's own, when tied)."""

    def __init__(self, table: QuantizedTable, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.table = table
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def dequantized_weight(self) -> torch.Tensor:
        """The (vocabulary x width) weight read back whole, frozen: for a loss that takes the head's
        weight itself (``train.fused_loss``)."""
        return self.table.dequantized()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits for ``hidden``."""
        logits: torch.Tensor = _FrozenMatmul.apply(hidden, self.table)  # type: ignore[no-untyped-call]
        return logits if self.bias is None else logits + self.bias.to(logits.dtype)


def quantize_embeddings(model: Any, kind: Literal["nf4", "int8"]) -> list[str]:
    """Replace ``model``'s input embedding and output head by quantized ones, in place, keeping a tie
    (one table for both) where the head's weight is the embedding's. Returns the replaced modules' names."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if not isinstance(embedding, nn.Embedding) or not isinstance(head, nn.Linear):
        raise ModelError(
            f"lora.quantize_embeddings: {type(model).__name__}'s embedding ({type(embedding).__name__}) and head "
            f"({type(head).__name__}) are not an nn.Embedding and an nn.Linear; set lora.quantize_embeddings=false"
        )
    names = {id(m): n for n, m in model.named_modules()}
    replaced = [names[id(embedding)], names[id(head)]]
    table = QuantizedTable(embedding.weight, kind)
    tied = head.weight is embedding.weight
    head_table = table if tied else QuantizedTable(head.weight, kind)
    model.set_input_embeddings(table)
    model.set_output_embeddings(QuantizedHead(head_table, head.bias))
    return replaced
