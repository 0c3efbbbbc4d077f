"""The training loss without full-vocabulary logits for every kept position at once.

The plain loss projects every kept position onto the vocabulary, keeps those logits (and a
float32 copy, and their gradient) alive until the backward pass: for SmolLM2's 49k vocabulary and
a 1024-token micro-batch, ~200 MB per copy. Here the output head runs inside the loss:

- ``chunked`` (plain torch, any device): :class:`ChunkedCrossEntropy` projects a chunk of positions
  at a time, takes its cross-entropy and, in the same pass, its gradients with respect to the
  hidden states and the head's weight. Only one chunk's logits exist at any moment, in the forward
  and the backward pass alike, and the matrix products are the three the plain loss does (logits,
  their gradient into the hidden states and into the weight), so it is not slower.
- ``liger``: Liger's fused linear cross-entropy (Triton kernels, CUDA only; the ``liger`` extra).

The head is swapped in for one forward pass (:func:`fused_head`): the model still runs through its
wrapper (DDP, FSDP, DeepSpeed), which hands the head's input to :func:`head_loss` instead of
computing logits, and the model's ``logits`` output is then the loss sum.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError, MissingDependencyError
from rayft.training.modeling.model import base_model

if TYPE_CHECKING:
    import torch

FusedLoss = Literal["auto", "chunked", "liger", "none"]
LossKind = Literal["chunked", "liger", "none"]

# Float32 logits of one chunk take at most about this many bytes: small on CPU, where memory is
# the point; larger on GPUs, whose matrix units want long products (and whose bf16 weight gradient
# of each chunk is a temporary of the head's size).
CHUNK_BYTES = 32 * 1024**2
CUDA_CHUNK_BYTES = 256 * 1024**2


@functools.cache
def liger_installed() -> bool:
    """Whether ``liger_kernel`` imports (checked once per process)."""
    try:
        import liger_kernel.transformers  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_loss(setting: str, device_type: str) -> LossKind:
    """The loss ``train.fused_loss`` stands for on ``device_type``: 'auto' is Liger on CUDA when it
    is installed, the chunked loss otherwise."""
    if setting == "auto":
        return "liger" if device_type == "cuda" and liger_installed() else "chunked"
    if setting == "liger":
        if device_type != "cuda":
            raise ConfigError(
                f"train.fused_loss=liger runs Triton kernels on CUDA GPUs, but this worker's device is {device_type}; "
                "use train.fused_loss=chunked (or auto)"
            )
        if not liger_installed():
            raise MissingDependencyError("liger-kernel", "liger", "train.fused_loss=liger (CUDA only)")
    if setting not in ("chunked", "liger", "none"):
        raise ConfigError(f"train.fused_loss={setting!r} is not one of auto, chunked, liger, none")
    return setting  # type: ignore[return-value]


def chunk_rows(vocab_size: int, device_type: str) -> int:
    """Positions per chunk: as many as fit :data:`CHUNK_BYTES` (:data:`CUDA_CHUNK_BYTES` on CUDA) of
    float32 logits, at least 16."""
    budget = CUDA_CHUNK_BYTES if device_type == "cuda" else CHUNK_BYTES
    return max(16, budget // (4 * vocab_size))


def head_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, kind: LossKind
) -> torch.Tensor:
    """Sum of cross-entropies of ``hidden @ weight.T + bias`` against ``targets`` (positions labelled
    IGNORE_INDEX count nothing), computed as ``kind`` says, in the autocast dtype when autocast is on."""
    import torch

    hidden, targets = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    trained = targets != IGNORE_INDEX
    hidden, targets = hidden[trained], targets[trained]
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    else:
        weight = weight.to(hidden.dtype)
    with torch.autocast(device_type=device, enabled=False):
        if kind == "liger":
            return _liger_loss(hidden, weight, bias, targets)
        return ChunkedCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows(weight.size(0), device))


def _liger_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> torch.Tensor:
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        raise MissingDependencyError("liger-kernel", "liger", "train.fused_loss=liger (CUDA only)") from None
    loss_fn = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
    return loss_fn(weight, hidden, targets, bias).float()  # type: ignore[no-any-return]


def _chunk_loss_and_grad(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cross-entropy sum of one chunk, and the gradient of that sum with respect to its logits."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    rows = torch.arange(targets.size(0), device=targets.device)
    loss = (lse - logits[rows, targets]).sum()
    if not with_grad:
        return loss, None
    grad = logits.sub_(lse.unsqueeze(-1)).exp_()  # softmax, in place of the logits
    grad[rows, targets] -= 1.0
    return loss, grad.to(hidden.dtype)


class ChunkedCrossEntropy:
    """``torch.autograd.Function`` (built on first use, so that importing this module needs no
    torch): the loss and, while gradients are on, the gradients of the hidden states, weight and
    bias, one chunk of positions at a time."""

    _function: type[torch.autograd.Function] | None = None

    @classmethod
    def apply(
        cls, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, rows: int
    ) -> torch.Tensor:
        """The loss sum, float32."""
        if cls._function is None:
            cls._function = _build_function()
        # torch leaves Function.apply unannotated
        loss = cls._function.apply(hidden, weight, bias, targets, rows)  # type: ignore[no-untyped-call]
        return cast("torch.Tensor", loss)


def _build_function() -> type[torch.autograd.Function]:
    import torch

    class _Chunked(torch.autograd.Function):
        @staticmethod
        def forward(  # noqa: PLR0917
            ctx: Any,  # autograd's context, to which forward attaches what backward reads (no declared attributes)
            hidden: torch.Tensor,
            weight: torch.Tensor,
            bias: torch.Tensor | None,
            targets: torch.Tensor,
            rows: int,
        ) -> torch.Tensor:
            needs = ctx.needs_input_grad
            with_grad = bool(needs[0] or needs[1] or needs[2])
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(hidden) if needs[0] else None
            grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs[1] else None
            grad_bias = torch.zeros_like(bias, dtype=torch.float32) if needs[2] and bias is not None else None
            for start in range(0, hidden.size(0), rows):
                h, t = hidden[start : start + rows], targets[start : start + rows]
                chunk_loss, grad = _chunk_loss_and_grad(h, weight, bias, t, with_grad)
                loss += chunk_loss
                if grad is None:
                    continue
                if grad_hidden is not None:
                    torch.mm(grad, weight, out=grad_hidden[start : start + rows])
                if grad_weight is not None and grad.dtype == grad_weight.dtype:
                    grad_weight.addmm_(grad.t(), h)  # in place: no weight-sized temporary
                elif grad_weight is not None:  # a bf16/fp16 product, accumulated in float32
                    grad_weight.add_(torch.mm(grad.t(), h))
                if grad_bias is not None:
                    grad_bias.add_(grad.sum(0))
            ctx.grads = (grad_hidden, grad_weight, grad_bias)
            ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
            return loss

        @staticmethod
        def backward(
            ctx: Any,  # autograd's context, with what forward attached to it
            grad_loss: torch.Tensor,
        ) -> tuple[torch.Tensor | None, ...]:
            scaled = [
                None if g is None else (g * grad_loss).to(dtype) for g, dtype in zip(ctx.grads, ctx.dtypes, strict=True)
            ]
            ctx.grads = None
            return (*scaled, None, None)

    return _Chunked


@contextlib.contextmanager
def fused_head(model: torch.nn.Module, targets: torch.Tensor, kind: LossKind, *, shifted: bool) -> Iterator[None]:
    """While open, the output head of ``model`` returns the loss sum of its input against ``targets``
    (see :func:`head_loss`) instead of logits. ``shifted``: the head sees every position, so its
    last one (which predicts nothing) is dropped first."""
    head = output_head(model)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if shifted:
            hidden = hidden[:, :-1]
        bias = cast("torch.Tensor | None", head.bias)
        return head_loss(hidden, head_weight(head).to(hidden.dtype), bias, targets, kind)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def head_weight(head: torch.nn.Module) -> torch.Tensor:
    """The head's weight: its own, or a quantized head's frozen table read back whole for this pass
    (``lora.quantize_embeddings``: :class:`rayft.models.quantized.QuantizedHead`)."""
    dequantized = getattr(head, "dequantized_weight", None)
    return cast("torch.Tensor", dequantized() if dequantized is not None else head.weight)


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The layer that makes logits, inside DDP and PEFT wrappers (PEFT's trained copy when the head
    is among ``modules_to_save``): a linear layer, or a quantized head (:func:`head_weight`); a head
    with a LoRA adapter of its own is refused."""
    import torch

    base = base_model(model)
    head = base.get_output_embeddings()  # type: ignore[no-untyped-call] # transformers leaves it unannotated
    copies = getattr(head, "modules_to_save", None)
    if copies is not None:
        head = copies[head.active_adapter if isinstance(head.active_adapter, str) else head.active_adapter[0]]
    if type(head) is not torch.nn.Linear and not hasattr(head, "dequantized_weight"):
        raise ConfigError(
            f"train.fused_loss computes the loss from the output head's weight, but {type(base).__name__}'s head "
            f"is a {type(head).__name__} (a LoRA adapter on lm_head?); set train.fused_loss=none or leave lm_head "
            "out of lora.target_modules"
        )
    return cast("torch.nn.Module", head)
