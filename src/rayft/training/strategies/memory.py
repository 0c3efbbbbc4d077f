"""How much device memory a worker needs for the model's state, checked before anything is moved
to the device, so that a run that cannot fit fails at once with what to change instead of running
out of memory minutes later.

The estimate counts what stays resident: weights, gradients and AdamW state (two fp32 tensors
per trained parameter, plus an fp32 master copy under DeepSpeed's bf16/fp16 modes), and the one
float32 temporary per trained parameter that AdamW's multi-tensor step holds while it updates,
divided over the workers by the sharded strategies. Activations come on top and depend on the
batch. The GPU test tier checks the estimate against the measured peak of real steps.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one worker holds for the model's state."""

    weights: int
    gradients: int
    optimizer: int
    step: int = 0  # AdamW's temporaries while it steps

    @property
    def total(self) -> int:
        """Weights, gradients, optimizer state and the optimizer step's temporaries together."""
        return self.weights + self.gradients + self.optimizer + self.step

    def describe(self) -> str:
        """The figures in GiB, for logs and errors."""
        parts = (("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer),
                 ("optimizer step", self.step))  # fmt: skip
        return f"{self.total / GIB:.1f} GiB ({', '.join(f'{name} {size / GIB:.1f}' for name, size in parts)})"


def estimate_worker_memory(
    *, total_params: int, trainable_params: int, weight_bytes: int, sharded: bool, world_size: int,
    master_copy: bool = False,
) -> MemoryEstimate:  # fmt: skip
    """The resident model state of one worker.

    Args:
        total_params: Parameters of the model, adapter included.
        trainable_params: Those the optimizer updates.
        weight_bytes: Bytes per weight as loaded (2 for bf16/fp16, 4 for fp32).
        sharded: FSDP or ZeRO-3: everything below is split over ``world_size`` workers.
        world_size: Workers.
        master_copy: The optimizer keeps an fp32 copy of the trained weights (DeepSpeed bf16/fp16).
    """
    share = max(world_size, 1) if sharded else 1
    optimizer_bytes = trainable_params * 4 * (3 if master_copy else 2)
    return MemoryEstimate(
        weights=total_params * weight_bytes // share,
        gradients=trainable_params * 4 // share,
        optimizer=optimizer_bytes // share,
        step=trainable_params * 4 // share,
    )


def memory_problem(estimate: MemoryEstimate, available: int, *, where: str, strategy: str, method: str) -> str | None:
    """Why the model's state cannot fit in ``available`` bytes of ``where``, with what to change
    (None when it fits)."""
    if estimate.total <= available:
        return None
    fixes = []
    if strategy == "ddp":
        fixes.append("train.strategy=fsdp (splits it over the workers)")
    else:
        fixes.append("more workers (scaling.num_workers)")
    if method == "full":
        fixes.append("train.method=lora")
    fixes.append("a smaller model")
    return (
        f"the model's state needs about {estimate.describe()} per worker with train.strategy={strategy}, before "
        f"activations, but {where} has {available / GIB:.1f} GiB free. Use {', or '.join(fixes)}."
    )
