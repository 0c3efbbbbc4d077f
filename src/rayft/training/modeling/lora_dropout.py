"""LoRA's input dropout without a second copy of every adapted layer's input.

PEFT computes an adapter's update as ``lora_B(lora_A(dropout(x)))``. For the backward pass autograd then
keeps the dropped-out input (``lora_A`` needs it for its weight's gradient) as well as dropout's mask:
per adapted linear layer, a copy of its whole input, on top of the input itself, which the frozen base
layer's path keeps anyway. With every linear layer of a decoder adapted (``all-linear``), those copies are a
large share of a LoRA step's activations (seven copies per block on a Llama-shaped model).

:func:`lean_lora_dropout` moves each vanilla adapter's dropout into its ``lora_A`` layer, as one autograd
function that keeps the undropped input and the mask, both of which the step holds anyway or costs a byte
an element, and recomputes the dropped-out input in the backward pass (one elementwise product). The
forward and the gradients are those of PEFT's path for the same mask (the tests compare them: bit for bit
where torch's dropout kernel draws the mask, as on CUDA; to float rounding where the CPU's faster mask
does, below). Parameter names, the saved adapter and the adapter's config are unchanged. PEFT has no such
option and torch's activation-memory tools (checkpointing, saved-tensor hooks) recompute or offload whole
blocks, so this small piece is written here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch.nn import functional

if TYPE_CHECKING:
    from torch.autograd.function import FunctionCtx


class _SavedContext(Protocol):
    """What the backward pass reads of the forward's context."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]
    scale: float
    folded: bool
    recompute: bool
    input_dtype: torch.dtype
    autocast: tuple[str, bool, torch.dtype]


# Random bits per element of the CPU's keep-mask: p is used as the nearest multiple of 2**-16 (0.05 as
# 0.0500031), and kept elements are scaled by the inverse of the probability used, so the dropped-out
# input's expectation is still the input.
MASK_BITS = 16


def cpu_keep_mask(shape: torch.Size, p: float) -> tuple[torch.Tensor, float] | None:
    """A boolean keep-mask of ``shape`` drawn from torch's CPU generator (an element is kept with
    probability ``1 - p`` rounded to 16 bits) and the scale of the kept elements; None where ``p`` rounds
    to 0 or 1 in 16 bits.

    Why not ``bernoulli_`` (what torch's dropout uses): on CPU it draws a double for every element, and took
    13% of the operators' time in a LoRA step of SmolLM2-135M (2 threads, every linear layer adapted). Here
    64 random bits from the same generator give four elements their 16 bits each; with the scale on the
    weight, one step's adapted layers ran 2.1-2.2x faster than with torch's kernel
    (``benchmarks/bench_lora_dropout.py``).
    """
    levels = 1 << MASK_BITS
    kept = round((1.0 - p) * levels)
    if not 0 < kept < levels:
        return None
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits random
    # As int16 the 16 bits run from -2**15; below kept - 2**15 is probability kept / 2**16.
    mask = (words.view(torch.int16)[:count] < kept - levels // 2).view(shape)
    return mask, levels / kept


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` times the keep-mask, as dropout multiplies (a NaN stays NaN). The mask is read as bytes: torch's
    CPU product of a float and a uint8 tensor is vectorised, of a float and a bool tensor (or ``where``) not
    (3-4x slower, 1,536-wide rows)."""
    return x * mask.view(torch.uint8)


class _DroppedInputLinear(torch.autograd.Function):
    """``functional.linear(dropout(x), weight)`` (no bias) that saves ``x`` and the mask, not the dropped-out input
    (under autocast, the dropped-out input in the autocast dtype, as PEFT's path does: see ``forward``).

    On CPU the mask comes from :func:`cpu_keep_mask` and the dropout's scale multiplies ``lora_A``'s weight
    (``r`` rows) instead of the input: an elementwise pass over the input fewer in each direction. Elsewhere
    (CUDA), torch's fused dropout kernel draws the mask, as PEFT's ``nn.Dropout`` does. The backward pass
    runs under the autocast state of the forward (as ``torch.amp.custom_bwd`` does), so that its products
    take the dtypes the forward's did.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, p: float) -> torch.Tensor:
        device = x.device.type
        autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        drawn = cpu_keep_mask(x.shape, p) if device == "cpu" else None
        if drawn is not None:
            mask, scale = drawn
            dropped = _masked(x, mask)
            # The scale goes on the r-wide weight, not the input: in float32 under autocast, as PEFT's input is.
            out = functional.linear(dropped, weight * scale)
        else:
            dropped, mask = torch.native_dropout(x, p, True)
            scale = 1.0 / (1.0 - p)
            out = functional.linear(dropped, weight)
        # Without autocast, x is what the frozen layer beside this one keeps anyway: keep it, and recompute the
        # dropped-out input. Under autocast that layer keeps its own low-precision copy and the product above
        # read the dropped-out input in the autocast dtype: keep that copy, which is what PEFT's path keeps.
        # The mask is kept for x's gradient and for recomputing the dropped-out input; without either, not.
        recompute = not (autocast[1] and x.dtype != autocast[2])
        needs_mask = recompute or x.requires_grad
        ctx.save_for_backward(x if recompute else dropped.to(autocast[2]), weight, *([mask] if needs_mask else []))
        ctx.scale, ctx.folded, ctx.recompute = scale, drawn is not None, recompute  # type: ignore[attr-defined]
        ctx.input_dtype, ctx.autocast = x.dtype, autocast  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(ctx: _SavedContext, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        kept, weight, *masks = ctx.saved_tensors
        mask = masks[0] if masks else None
        scale = ctx.scale
        device, enabled, dtype = ctx.autocast
        if ctx.folded:
            weight_used = weight * scale  # what the forward's product took

            def drop(t: torch.Tensor) -> torch.Tensor:
                assert mask is not None  # saved whenever a gradient reads it
                return _masked(t, mask)
        else:
            weight_used = weight

            def drop(t: torch.Tensor) -> torch.Tensor:
                return cast("torch.Tensor", torch.ops.aten.native_dropout_backward(t, mask, scale))

        grad_x = grad_w = None
        with torch.autocast(device_type=device, dtype=dtype, enabled=enabled):
            if ctx.needs_input_grad[0]:
                grad_x = drop(grad.matmul(weight_used).to(ctx.input_dtype))
            if ctx.needs_input_grad[1]:
                dropped = drop(kept) if ctx.recompute else kept
                grad_w = grad.reshape(-1, grad.shape[-1]).t().mm(dropped.reshape(-1, dropped.shape[-1]))
                if ctx.folded:  # the product's gradient, scaled (in float32 under autocast)
                    grad_w = grad_w.to(weight.dtype) * scale
        return grad_x, grad_w, None


class DroppedInputLinear(torch.nn.Linear):
    """An adapter's ``lora_A`` layer that applies the adapter's input dropout itself (in training; in
    evaluation it is the plain linear layer). It holds ``lora_A``'s own weight, under the same name."""

    def __init__(self, weight: torch.nn.Parameter, dropout_p: float) -> None:
        out_features, in_features = weight.shape
        super().__init__(in_features, out_features, bias=False, device="meta")
        self.weight = weight
        self.dropout_p = dropout_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        return _DroppedInputLinear.apply(x, self.weight, self.dropout_p)  # type: ignore[no-any-return,no-untyped-call]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dropout_p={self.dropout_p}"


def lean_lora_dropout(net: torch.nn.Module) -> int:
    """Move the input dropout of every vanilla LoRA linear adapter of ``net`` (p > 0, no bias on ``lora_A``;
    not DoRA or another variant, which use the dropped-out input themselves) into its ``lora_A`` layer, in
    place, before an optimizer or a wrapper holds the model. Returns how many adapters were changed."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    changed = 0
    for module in net.modules():
        if type(module) is not LoraLinear:
            continue
        for name, dropout in list(module.lora_dropout.items()):
            lora_a = module.lora_A[name]
            if (
                not isinstance(dropout, torch.nn.Dropout)
                or dropout.p == 0
                or name in module.lora_variant
                or type(lora_a) is not torch.nn.Linear
                or lora_a.bias is not None
            ):
                continue
            module.lora_A[name] = DroppedInputLinear(lora_a.weight, float(dropout.p))
            module.lora_dropout[name] = torch.nn.Identity()
            changed += 1
    return changed
