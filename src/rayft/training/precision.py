"""Mixed precision of a worker: which dtype autocast uses, and whether fp16 needs loss scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: full precision) and whether fp16 loss scaling is needed."""

    autocast_dtype: torch.dtype | None
    use_grad_scaler: bool


def resolve_precision(mixed_precision: str, device_type: str) -> Precision:
    """Map the mixed_precision setting to autocast on GPU; CPUs always run fp32."""
    import torch

    if device_type != "cuda" or mixed_precision == "no":
        return Precision(None, False)
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    return Precision(dtype, dtype == torch.float16)
