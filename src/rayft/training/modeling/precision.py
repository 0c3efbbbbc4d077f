"""Mixed precision of a worker: which dtype autocast uses, and whether fp16 needs loss scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayft.models.architecture import check_float16

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: full precision) and whether fp16 loss scaling is needed."""

    autocast_dtype: torch.dtype | None
    use_grad_scaler: bool


def resolve_precision(mixed_precision: str, device_type: str, model_type: str = "") -> Precision:
    """Map the mixed_precision setting to autocast. On CPU only an explicit 'bf16' autocasts (the step's
    planner leaves 'auto' in fp32 there: :mod:`rayft.training.modeling.step_choice`). float16 is refused
    for the model families that overflow in it (``model_type`` T5, mT5: see
    :func:`rayft.models.architecture.check_float16`)."""
    import torch

    if device_type == "cpu" and mixed_precision == "bf16":
        return Precision(torch.bfloat16, False)
    if device_type != "cuda" or mixed_precision == "no":
        return Precision(None, False)
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    if dtype == torch.float16:
        check_float16(model_type, "train.mixed_precision resolves to fp16 on this GPU")
    return Precision(dtype, dtype == torch.float16)
