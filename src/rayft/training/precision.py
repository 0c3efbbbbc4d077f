"""Mixed precision of a worker: which dtype autocast uses, and whether fp16 needs loss scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayft.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: full precision) and whether fp16 loss scaling is needed."""

    autocast_dtype: torch.dtype | None
    use_grad_scaler: bool


def resolve_precision(mixed_precision: str, device_type: str, model_type: str = "") -> Precision:
    """Map the mixed_precision setting to autocast on GPU; CPUs always run fp32. float16 is refused
    for the model families that overflow in it (``model_type`` T5, mT5: see :func:`check_float16`)."""
    import torch

    if device_type != "cuda" or mixed_precision == "no":
        return Precision(None, False)
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    if dtype == torch.float16:
        check_float16(model_type, "train.mixed_precision resolves to fp16 on this GPU")
    return Precision(dtype, dtype == torch.float16)


FP16_UNSAFE = ("t5", "mt5", "umt5")
"""transformers model types whose activations overflow float16 (T5's feed-forward outputs exceed 65504)."""


def check_float16(model_type: str, setting: str) -> None:
    """ConfigError when float16 (named by ``setting``) is asked for a model type in :data:`FP16_UNSAFE`."""
    if model_type in FP16_UNSAFE:
        raise ConfigError(
            f"{setting}: {model_type} models overflow in float16 (their feed-forward activations exceed 65504 "
            "and the loss becomes inf or nan); use bf16 (train.mixed_precision=bf16, on a GPU that has it) or "
            "full precision (train.mixed_precision=no)"
        )
