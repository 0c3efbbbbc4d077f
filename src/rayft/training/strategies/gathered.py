"""The whole weights of a sharded model (FSDP2's, or DeepSpeed ZeRO-3's), gathered once on every worker for a
stretch of work that runs forwards a different number of times on each worker: GRPO's colocated sampling, where
every worker decodes its own completions until they end.

Both strategies gather a module's parameters in its forward (FSDP2 a transformer block, ZeRO-3 any module).
Under ``generate`` every decoding step is one forward per module, so every step would be one all-gather per
module, and a worker whose completions end sooner would stop joining them while another still waits in one: a
deadlock. So before such work every parameter is all-gathered once, in the same order on every worker, and kept
whole: the forwards inside then find their parameters whole and run no collective. After it the parameters are
sharded again.

This holds the whole weights on every worker at once (not the gradients or optimizer state, which stay split):
the memory of one unsharded copy of the model, as TRL's default for ZeRO-3 (``ds3_gather_for_generation``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from rayft.errors import TrainingError

if TYPE_CHECKING:
    import torch
    from torch.distributed.fsdp import FSDPModule


@contextlib.contextmanager
def fsdp_whole(model: torch.nn.Module) -> Iterator[None]:
    """Every parameter of ``model`` (sharded by ``fully_shard``, its root the model itself) whole on this
    worker for the duration; every worker enters together. The forwards inside run no collective.

    Every FSDP unit is all-gathered and kept whole (``reshard_after_forward`` off); after, every unit is
    sharded again and the setting restored."""
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


@contextlib.contextmanager
def zero3_whole(engine: torch.nn.Module) -> Iterator[None]:
    """Every parameter of the model in DeepSpeed's ZeRO-3 ``engine`` whole on this worker for the duration; every
    worker enters together. The forwards inside run no collective.

    ``deepspeed.zero.GatheredParameters`` all-gathers the parameters (one collective, the same order everywhere)
    and partitions them again on exit. It does not keep them whole through a forward: the engine's hooks on every
    module fetch the module's parameters before it runs and release them after, so the next decoding step would
    gather them again (the deadlock of the module docstring). So the hooks are taken off inside, as DeepSpeed's
    ``unwrap_model_for_generation`` and TRL's ``unwrap_model_for_generation`` do, and put back on after. Unlike
    those, the root's start-of-forward hook comes off too (its ``reset_step`` runs collectives while the engine
    records its trace of the modules, and workers run different numbers of forwards here), and the hooks are put
    back also when the work inside raises.
    """
    import deepspeed

    offload: Any = cast("Any", engine).optimizer.parameter_offload  # DeepSpeedZeRoOffload: the hooks' owner
    with deepspeed.zero.GatheredParameters(list(engine.parameters())):
        start_of_forward = _take_hooks_off(offload)
        try:
            yield
        finally:
            _put_hooks_back(offload, start_of_forward)


def _take_hooks_off(offload: Any) -> Callable[..., object]:
    """Remove the ZeRO-3 hooks of ``offload``'s model; return the root's start-of-forward hook (DeepSpeed keeps
    only its handle) to register again."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params

    root: torch.nn.Module = offload.module
    start_of_forward = root._forward_pre_hooks[offload.fwd_pre_hook.id]
    # Modules renumber when their hooks are registered again: a parameter still marked in use by one would
    # never be released after.
    for param in iter_params(root, recurse=True):
        param.ds_active_sub_modules.clear()
    for handle in (offload.fwd_pre_hook, *offload.forward_hooks, *offload.backward_hooks):
        handle.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    return cast("Callable[..., object]", start_of_forward)


def _put_hooks_back(offload: Any, start_of_forward: Callable[..., object]) -> None:
    """Register the hooks again, in DeepSpeed's order (the start-of-forward hook first); DeepSpeed then discards
    its trace of the modules' order, which the next training forward records again."""
    root: torch.nn.Module = offload.module
    offload.fwd_pre_hook = root.register_forward_pre_hook(start_of_forward)
    offload._register_deepspeed_module(root)
