"""Optional fused kernels patched into a training model: Liger's RMSNorm, SwiGLU and RoPE (``train.liger_kernels``).

Liger's kernels are Triton programs for CUDA GPUs (the ``liger`` extra); they replace the forward pass of
every RMSNorm and gated MLP module of the model instance and the rotary embedding of its modelling module,
with the same results to within rounding. Its fused linear cross-entropy is the loss ``train.fused_loss=liger``
(:mod:`rayft.training.modeling.loss`). The ``gpu`` test tier checks each against the plain modules in loss
and gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayft.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    import torch

LIGER_PARTS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def check_liger_device(device_type: str) -> None:
    """ConfigError unless ``device_type`` is one Liger's Triton kernels run on."""
    if device_type != "cuda":
        raise ConfigError(
            f"train.liger_kernels runs Liger's Triton kernels on CUDA GPUs, but this worker's device is {device_type}; "
            "set train.liger_kernels=false"
        )


def apply_liger_kernels(net: torch.nn.Module, device_type: str) -> None:
    """Patch Liger's RMSNorm, SwiGLU and RoPE into ``net`` (a transformers model, before its adapter is attached).

    Refused on a device Liger cannot run on, without the package (with its install line), and for a model
    type Liger has no patch for.
    """
    check_liger_device(device_type)
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        raise MissingDependencyError("liger-kernel", "liger", "train.liger_kernels (CUDA only)") from None
    model_type = getattr(net.config, "model_type", "")
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ConfigError(
            f"train.liger_kernels: Liger has no kernels for model type {model_type!r} (it patches "
            f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set train.liger_kernels=false"
        )
    _apply_liger_kernel_to_instance(model=net, **LIGER_PARTS)
