"""LoRA's input dropout without a second copy of every adapted layer's input.

PEFT computes an adapter's update as ``lora_B(lora_A(dropout(x)))``. For the backward pass autograd then
keeps the dropped-out input (``lora_A`` needs it for its weight's gradient) as well as dropout's mask:
per adapted linear layer, a copy of its whole input, on top of the input itself, which the frozen base
layer's path keeps anyway. With every linear layer of a decoder adapted (``all-linear``), those copies are a
large share of a LoRA step's activations (seven copies per block on a Llama-shaped model).

:func:`lean_lora_dropout` moves each vanilla adapter's dropout into its ``lora_A`` layer, as one autograd
function that keeps the undropped input and the mask, both of which the step holds anyway or costs a byte
an element, and recomputes the dropped-out input in the backward pass (one elementwise product). The
forward and the gradients are those of PEFT's path: the same dropout kernel draws the same mask from the
same generator, and the backward pass runs the same products (the tests compare both bit for bit on CPU).
Parameter names, the saved adapter and the adapter's config are unchanged. PEFT has no such option and
torch's activation-memory tools (checkpointing, saved-tensor hooks) recompute or offload whole blocks,
so this small piece is written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch.nn import functional

if TYPE_CHECKING:
    from torch.autograd.function import FunctionCtx


class _SavedContext(Protocol):
    """What the backward pass reads of the forward's context."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]
    scale: float


class _DroppedInputLinear(torch.autograd.Function):
    """``functional.linear(dropout(x), weight)`` (no bias) that saves ``x`` and the mask, not the dropped-out input."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, p: float) -> torch.Tensor:
        dropped, mask = torch.native_dropout(x, p, True)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(x, mask, weight)
        ctx.scale = scale  # type: ignore[attr-defined] # ctx carries the function's own state
        return functional.linear(dropped, weight)

    @staticmethod
    def backward(ctx: _SavedContext, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, mask, weight = ctx.saved_tensors
        scale = ctx.scale
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.native_dropout_backward(grad.matmul(weight), mask, scale)
        if ctx.needs_input_grad[1]:
            dropped = torch.ops.aten.native_dropout_backward(x, mask, scale)
            grad_w = grad.reshape(-1, grad.shape[-1]).t().mm(dropped.reshape(-1, dropped.shape[-1]))
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
