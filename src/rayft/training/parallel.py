"""How the workers share the model (``train.strategy``), and how its state leaves and re-enters
the workers whatever the strategy.

- ``ddp``: every worker holds the whole model; gradients are averaged by an all-reduce.
- ``fsdp``: PyTorch FSDP2 (``fully_shard``): parameters, gradients and optimizer state are split
  over the workers (ZeRO-3), each transformer block is gathered just before it runs and freed
  after. Memory per worker falls roughly with the worker count, for one all-gather per block.

Checkpoints have one layout for every strategy: the full weights (or adapter) as rank 0 writes
them without any strategy, and the optimizer state keyed by parameter name. So a run saved under
one strategy or worker count resumes under another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from rayft.errors import TrainingError
from rayft.training.model import unwrap

if TYPE_CHECKING:
    import torch

    from rayft.training.steps import Precision

Strategy = Literal["ddp", "fsdp"]


def prepare_model(
    model: Any, strategy: Strategy, device: torch.device, *, world_size: int, precision: Precision
) -> Any:
    """Move ``model`` to ``device`` and apply ``strategy`` across ``world_size`` workers (one
    worker: nothing to share, the model is only moved)."""
    import torch

    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = model.to(device)
    if world_size <= 1:
        return model
    return _STRATEGIES[strategy](model, device, precision)


def _wrap_ddp(model: Any, device: torch.device, precision: Precision) -> Any:
    """DistributedDataParallel. Buffers are synced once at wrap time, not on every forward:
    causal LMs have no buffer that training changes."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def _shard_fsdp(model: Any, device: torch.device, precision: Precision) -> Any:
    """FSDP2: each transformer block is a unit of its own, the rest (embeddings, final norm and
    head, tied or not) one more. With autocast on GPU, blocks are gathered in its dtype and
    gradients reduced in float32."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision.use_grad_scaler:
        raise TrainingError(
            "train.strategy=fsdp does not train in fp16 (loss scaling over sharded gradients is not supported); "
            "set train.mixed_precision=bf16 on a GPU that has it, or train.strategy=ddp"
        )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=precision.autocast_dtype, reduce_dtype=torch.float32)
    blocks = block_classes(model)
    for module in shard_units(model, blocks):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


_STRATEGIES: dict[str, Callable[[Any, Any, Any], Any]] = {"ddp": _wrap_ddp, "fsdp": _shard_fsdp}


def block_classes(model: Any) -> frozenset[str]:
    """Class names of the model's transformer blocks: the modules transformers never splits
    across devices (``_no_split_modules``), looked up through PEFT and DDP wrappers."""
    inner = unwrap(model)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    names = frozenset(getattr(base, "_no_split_modules", None) or ())
    if not names:
        raise TrainingError(
            f"train.strategy=fsdp: {type(base).__name__} does not name its transformer blocks "
            "(transformers' _no_split_modules), so rayft cannot tell what to shard; use train.strategy=ddp"
        )
    return names


def shard_units(model: Any, blocks: Iterable[str]) -> list[Any]:
    """The submodules that become FSDP units of their own, in module order: every instance of a
    block class (not nested in another one)."""
    wanted = frozenset(blocks)
    units: list[Any] = []
    for name, module in model.named_modules():
        if type(module).__name__ in wanted and not any(name.startswith(f"{p}.") for p, _ in units):
            units.append((name, module))
    if not units:
        raise TrainingError(f"train.strategy=fsdp: the model holds no module of the classes {sorted(wanted)}")
    return [module for _, module in units]


def is_sharded(model: Any) -> bool:
    """Whether the parameters are split over the workers (FSDP): reading the whole state is then
    a collective that every rank must join."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def trainable_names(model: Any) -> list[str]:
    """Names of the parameters the optimizer updates, as a checkpoint stores them."""
    return [name for name, p in unwrap(model).named_parameters() if p.requires_grad]


def model_state(model: Any, method: str, rank: int) -> dict[str, Any] | None:
    """CPU copies of what a checkpoint stores of the model, on rank 0 (None elsewhere): the
    trained parameters of a LoRA adapter (PEFT picks the adapter keys from them), or the whole
    state dict for full fine-tuning. Always full tensors, never one rank's shard.

    Sharded models gather here, so every rank must call it.
    """
    if not is_sharded(model):
        return cpu_copy(_local_model_state(unwrap(model), method)) if rank == 0 else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if method == "lora":
        # One all-gather per parameter, in the same order on every rank.
        gathered = {name: p.full_tensor() for name, p in _trainable(model)}
        return {name: t.detach().cpu() for name, t in gathered.items()} if rank == 0 else None
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return retie(dict(state), model) if rank == 0 else None


def retie(state: dict[str, Any], model: Any) -> dict[str, Any]:
    """``state`` with the entries of tied parameters (one parameter under several names, as tied
    input and output embeddings) sharing one tensor again: gathering copies each name on its own,
    and transformers recognises tied weights by their shared storage when it saves them."""
    names: dict[int, list[str]] = {}
    for name, param in unwrap(model).named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for group in names.values():
        present = [name for name in group if name in state]
        for name in present[1:]:
            state[name] = state[present[0]]
    return state


def _trainable(model: Any) -> Iterator[tuple[str, Any]]:
    return ((name, p) for name, p in unwrap(model).named_parameters() if p.requires_grad)


def _local_model_state(model: Any, method: str) -> dict[str, Any]:
    if method == "lora":
        return dict(_trainable(model))
    return dict(model.state_dict())


def optimizer_state(model: Any, optimizer: Any, rank: int) -> dict[str, Any] | None:
    """CPU copies of the optimizer state keyed by parameter name, whole (not sharded), on rank 0
    (None elsewhere). Sharded models gather here, so every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if not is_sharded(model):
        if rank != 0:
            return None
        # Plain tensors come back as the live state itself: copied, so that training may go on.
        live = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
        return dict(cpu_copy(live))
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    gathered = get_optimizer_state_dict(model, optimizer, options=options)
    return dict(gathered) if rank == 0 else None


def load_optimizer_state(model: Any, optimizer: Any, saved: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state (whole, keyed by parameter name) into ``optimizer``,
    sharding it as the model is. Checkpoints written before states were keyed by name (keyed by
    position) load as they were saved."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if all(isinstance(key, int) for key in saved.get("state", {})) and not is_sharded(model):
        optimizer.load_state_dict(saved)
        return
    set_optimizer_state_dict(model, optimizer, saved, options=StateDictOptions(full_state_dict=True))


def check_full_shapes(state: dict[str, Any], model: Any) -> None:
    """Refuse to save a model state that is not whole: every tensor must have its parameter's
    full shape (a shard's shape would save one rank's slice), and a LoRA state must hold every
    trained parameter (an empty adapter saves nothing)."""
    shapes = {name: tuple(p.shape) for name, p in unwrap(model).named_parameters()}
    wrong = [
        f"{name}: {tuple(t.shape)} instead of {shapes[name]}"
        for name, t in state.items()
        if name in shapes and tuple(t.shape) != shapes[name]
    ]
    missing = sorted(set(trainable_names(model)) - set(state))
    if wrong or missing:
        detail = "; ".join(wrong[:3] + [f"missing {m}" for m in missing[:3]])
        raise TrainingError(f"refusing to save a checkpoint that is not the whole model: {detail}")


def cpu_copy(value: Any) -> Any:
    """A deep copy of ``value`` whose tensors are detached CPU copies (shared storage stays shared)."""
    import torch

    memo: dict[tuple[int, int, tuple[int, ...]], Any] = {}

    def copy(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            key = (item.untyped_storage().data_ptr(), int(item.storage_offset()), tuple(int(d) for d in item.shape))
            if key not in memo:
                memo[key] = item.detach().to("cpu", copy=True)
            return memo[key]
        if isinstance(item, dict):
            return {k: copy(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return type(item)(copy(v) for v in item)
        return item

    return copy(value)
