"""A LoRA run's frozen base layers multiplied in bf16, everything trained in float32.

In a LoRA step on a CPU most of the time goes to the frozen base layers' matrix products (each adapted
layer's ``x @ W.T`` forward and ``grad @ W`` backward). On CPUs with bf16 instructions (``avx512_bf16``,
``amx_bf16``) torch's bf16 product runs about twice as fast as the float32 one at a Llama block's widths.
``train.mixed_precision: bf16`` gets that too, but autocasts every product, the adapter's, attention's and
the loss head's among them, and was measured to reach a higher loss.

:func:`bf16_frozen_layers` changes only the frozen layers: each adapted layer's base weight is stored in
bf16 (half its memory) and multiplies a bf16 copy of its input; its output goes back to the input's dtype
before the adapter's update is added. The adapter, norms, attention, residual stream and loss keep the
run's precision, and the trained tensors, their gradients and the optimizer stay float32. The gradient
into the input is computed the same way (``grad @ W`` in bf16); the frozen weight gets none.

PEFT's ``autocast_adapter_dtype`` keeps an adapter in float32 over a base loaded in bf16, but a base
loaded in bf16 runs its norms, residual stream and head in bf16 too; torch has no per-module autocast
that leaves the rest in float32, so this small layer is written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch.nn import functional

if TYPE_CHECKING:
    from torch.autograd.function import FunctionCtx

BF16 = torch.bfloat16


class _SavedContext(Protocol):
    """What the backward pass reads of the forward's context."""

    saved_tensors: tuple[torch.Tensor, ...]


class _Bf16Product(torch.autograd.Function):
    """``x @ weight.T`` with ``x`` rounded to bf16 and the product returned in ``x``'s dtype; the backward
    pass gives ``x`` its gradient the same way and the frozen ``weight`` none. Autograd keeps only the
    weight (no copy of the input: a frozen weight needs no input for its gradient)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return functional.linear(x.to(weight.dtype), weight).to(x.dtype)

    @staticmethod
    def backward(ctx: _SavedContext, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weight,) = ctx.saved_tensors
        # The output has the input's dtype, and so has its gradient.
        return torch.matmul(grad.to(weight.dtype), weight).to(grad.dtype), None


class FrozenBf16Linear(torch.nn.Linear):
    """A frozen linear layer whose weight is stored in bf16 and whose product runs in bf16 (see the module's
    docstring); the bias, if any, stays in its dtype and is added in the input's. Parameter names are the
    layer's own, so state dicts and the adapter's keys are unchanged."""

    def __init__(self, layer: torch.nn.Linear) -> None:
        super().__init__(layer.in_features, layer.out_features, bias=False, device="meta")
        self.weight = torch.nn.Parameter(layer.weight.detach().to(BF16), requires_grad=False)
        self.bias = layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Bf16Product.apply(x, self.weight)  # type: ignore[no-untyped-call]  # unannotated in torch
        bias: torch.Tensor | None = self.bias  # nn.Linear annotates it as always set; a layer without one has None
        return out if bias is None else out + bias.to(out.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, frozen bf16 product"


def bf16_frozen_layers(net: torch.nn.Module) -> int:
    """Replace the frozen float32 base layer of every LoRA linear adapter of ``net`` (a plain
    ``nn.Linear``: not a quantized base, not a trained one) with a :class:`FrozenBf16Linear`, in place,
    before an optimizer or a wrapper holds the model. Returns how many layers were replaced."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    changed = 0
    for module in net.modules():
        if not isinstance(module, LoraLinear):
            continue
        base = module.base_layer
        if type(base) is not torch.nn.Linear or base.weight.requires_grad or base.weight.dtype != torch.float32:
            continue
        module.base_layer = FrozenBf16Linear(base)
        changed += 1
    if changed:
        _release_weights_file(net)
    return changed


def _release_weights_file(net: torch.nn.Module) -> None:
    """Give every tensor of ``net`` left in another dtype than bf16 storage of its own.

    transformers maps the weights' file, and where the file's dtype is the model's the parameters are
    views of that mapping. Converting a layer's weight reads all of its pages, which then stay resident in
    this process for as long as any view of the mapping lives (the embedding and the norms do): measured
    on SmolLM2-135M, 568 MiB of the file's pages beside the 212 MiB of bf16 weights. Once nothing views
    the mapping, it goes, and with it those pages (the copies made here take 113 MiB for that model)."""
    seen: set[int] = set()
    with torch.no_grad():
        for module in net.modules():
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is None or id(tensor) in seen or tensor.dtype == BF16:
                    continue
                seen.add(id(tensor))  # a tied weight is one tensor under two names: copied once
                tensor.data = tensor.data.clone()
