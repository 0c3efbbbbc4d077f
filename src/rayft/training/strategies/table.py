"""The one table from ``train.strategy`` to its implementation
(:class:`~rayft.training.strategies.parallel.Parallelism`).

It sits above both implementations, :mod:`rayft.training.strategies.parallel` (DDP, FSDP) and
:mod:`rayft.training.strategies.zero3` (DeepSpeed ZeRO-3, which builds on the former's pieces), so neither
imports the other's caller.
"""

from __future__ import annotations

from collections.abc import Callable

from rayft.training.strategies.parallel import Parallelism, Strategy, TorchParallelism, shard_fsdp, wrap_ddp
from rayft.training.strategies.zero3 import DeepSpeedZero3

STRATEGIES: dict[str, Callable[[], Parallelism]] = {
    "ddp": lambda: TorchParallelism(wrap=wrap_ddp),
    "fsdp": lambda: TorchParallelism(wrap=shard_fsdp, sharded=True),
    "deepspeed": DeepSpeedZero3,
}


def parallelism(strategy: Strategy, world_size: int) -> Parallelism:
    """The strategy's implementation; with one worker there is nothing to share."""
    if world_size <= 1:
        return TorchParallelism(wrap=None)
    return STRATEGIES[strategy]()
