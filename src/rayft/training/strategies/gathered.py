"""The whole weights of a model sharded by FSDP2, gathered once on every worker for a stretch of work that
runs forwards a different number of times on each worker: GRPO's colocated sampling, where every worker
decodes its own completions until they end.

FSDP2 all-gathers a transformer block in the block's forward. Under ``generate`` every decoding step is one
forward per block, so every step would be one all-gather per block, and a worker whose completions end
sooner would stop joining them while another still waits in one: a deadlock. So before such work every FSDP
unit is all-gathered once, in the same order on every worker, and kept whole (``reshard_after_forward``
off): the forwards inside then find their parameters unsharded and run no collective. After it every unit
is sharded again and the setting restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from rayft.errors import TrainingError

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import FSDPModule


@contextlib.contextmanager
def fsdp_whole(model: torch.nn.Module) -> Iterator[None]:
    """Every parameter of ``model`` (sharded by ``fully_shard``, its root the model itself) whole on this
    worker for the duration; every worker enters together. The forwards inside run no collective."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    units = [cast("FSDPModule", m) for m in model.modules() if isinstance(m, FSDPModule)]
    root = units[0]
    if not hasattr(root, "reset_iter_state"):
        raise TrainingError(
            f"train.strategy=fsdp with GRPO needs FSDPModule.reset_iter_state, which torch {torch.__version__} "
            "lacks; upgrade torch or set train.strategy=ddp"
        )
    # The root is found at its first forward; a block's forward (``generate`` calls the transformers model
    # inside the PEFT root) would otherwise make that block a root of its own. FSDP2 has no public call for it.
    root._get_fsdp_state()._lazy_init()
    root.set_reshard_after_forward(False)
    try:
        for unit in units:  # one all-gather per unit, in module order on every worker
            unit.unshard()
        yield
    finally:
        # Reshards every unit and forgets the forwards run meanwhile (FSDP records each forward's order to
        # prefetch in the next backward: a different count on each worker here). Nothing is in flight:
        # gradients are reduced within a step, and this runs between steps.
        root.reset_iter_state()
        # FSDP's own setting: units reshard after their forward, the root (needed again first in backward) not.
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)
