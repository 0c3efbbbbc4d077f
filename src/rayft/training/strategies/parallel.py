"""How the workers share the model (``train.strategy``): what each strategy does differently, and how
the model's state leaves and re-enters the workers whatever the strategy. The table from a strategy's
name to its implementation is :mod:`rayft.training.strategies.table`.

- ``ddp``: every worker holds the whole model; gradients are averaged by an all-reduce.
- ``fsdp``: PyTorch FSDP2 (``fully_shard``): parameters, gradients and optimizer state are split
  over the workers (ZeRO-3), each transformer block is gathered just before it runs and freed
  after. Memory per worker falls roughly with the worker count, for one all-gather per block.
- ``deepspeed``: DeepSpeed ZeRO stage 3 (:mod:`rayft.training.strategies.zero3`), the same sharding by
  DeepSpeed's engine, with its CPU/NVMe offload options.

Checkpoints have one layout for every strategy: the full weights (or adapter) as rank 0 writes
them without any strategy, and the optimizer state keyed by parameter name. So a run saved under
one strategy or worker count resumes under another.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar, cast

from rayft.errors import TrainingError
from rayft.training.modeling.model import base_model, full_shape, named_trainable, on_meta, unwrap
from rayft.training.strategies.gathered import fsdp_whole

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor import DTensor

    from rayft.training.modeling.precision import Precision

Strategy = Literal["ddp", "fsdp", "deepspeed"]
MakeOptimizer: TypeAlias = "Callable[[torch.nn.Module], torch.optim.Optimizer]"
T = TypeVar("T")


@dataclass(frozen=True)
class ParallelSetup:
    """What a strategy needs to set itself up on a worker."""

    device: torch.device
    world_size: int
    precision: Precision
    micro_batch_size: int
    max_grad_norm: float | None
    deepspeed: dict[str, Any] = field(default_factory=dict)  # entries merged over rayft's DeepSpeed config


class Parallelism(Protocol):
    """What a strategy does at each point of the loop where strategies differ."""

    @property
    def sharded(self) -> bool:
        """Whether parameters are split over the workers: every forward is then a collective,
        so workers evaluate in lockstep, and reading the whole state is one that all ranks join."""
        ...

    @property
    def weights_from_rank0(self) -> bool:
        """Whether only rank 0 loads the weights: the other workers build the model on the meta
        device and :meth:`prepare` fills it from rank 0."""
        ...

    def prepare(
        self, model: torch.nn.Module, make_optimizer: MakeOptimizer, setup: ParallelSetup
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model as the loop runs it (placed, wrapped or sharded, and filled from rank 0 where
        it was built without weights), and the torch optimizer over its trainable parameters."""
        ...

    def accumulating(self, model: torch.nn.Module, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """The context of one micro-batch's forward and backward (``last``: of the step)."""
        ...

    def backward(self, model: torch.nn.Module, loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        """Back-propagate ``loss`` (already scaled for the step)."""
        ...

    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        max_grad_norm: float | None,
    ) -> float:
        """Clip, take the optimizer step, clear the gradients; return the gradient norm before clipping."""
        ...

    def model_state(self, model: torch.nn.Module, method: str, rank: int) -> dict[str, torch.Tensor] | None:
        """CPU copies of what a checkpoint stores of the model, on rank 0 (None elsewhere): the
        trained parameters of a LoRA adapter (PEFT picks the adapter keys from them), or the whole
        state dict for full fine-tuning. Whole tensors, never one rank's shard."""
        ...

    def optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int
    ) -> dict[str, Any] | None:
        """CPU copies of the whole optimizer state keyed by parameter name, on rank 0 (None
        elsewhere), as ``torch.distributed.checkpoint``'s full optimizer state dict."""
        ...

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
    ) -> None:
        """Load a checkpoint's optimizer state, sharded as the model is."""
        ...

    def whole_weights(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Every parameter whole on this worker for the duration (every worker enters together), so that
        forwards inside run no collective and may differ in number between workers (colocated sampling);
        for a strategy that does not shard, nothing."""
        ...


def wrap_ddp(model: torch.nn.Module, setup: ParallelSetup) -> torch.nn.Module:
    """DistributedDataParallel, which broadcasts rank 0's parameters and buffers as it wraps (so a
    worker that built the model without weights gets rank 0's). Buffers are not synced again on
    every forward: causal LMs have no buffer that training changes. The gradients are views of DDP's
    all-reduce buckets: otherwise the buckets are a second copy of every trained parameter's
    gradient, held for the whole run (513 MiB per worker for SmolLM2-135M's full fine-tuning:
    ``benchmarks/bench_worker_memory.py``)."""
    from torch.nn.parallel import DistributedDataParallel

    model = materialize(model, setup.device) if on_meta(model) else model.to(setup.device)
    ids = [setup.device.index] if setup.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False, gradient_as_bucket_view=True)


def shard_fsdp(model: torch.nn.Module, setup: ParallelSetup) -> torch.nn.Module:
    """FSDP2: each transformer block is a unit of its own, the rest (embeddings, final norm and
    head, tied or not) one more. With autocast on GPU, blocks are gathered in its dtype and
    gradients reduced in float32.

    Rank 0 holds the loaded weights on the CPU; the whole model never goes to one device. Each
    unit is sharded as it is, then every worker's shards are filled from rank 0's copy (a
    broadcast), buffers included, which state dicts leave out when they are not persistent.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if setup.precision.use_grad_scaler:
        raise TrainingError(
            "train.strategy=fsdp does not train in fp16 (loss scaling over sharded gradients is not supported); "
            "set train.mixed_precision=bf16 on a GPU that has it, or train.strategy=ddp or deepspeed"
        )
    mesh = init_device_mesh(setup.device.type, (setup.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=setup.precision.autocast_dtype, reduce_dtype=torch.float32)
    empty = on_meta(model)
    loaded = {} if empty else model.state_dict()  # references, not copies: sharding copies each unit
    blocks = block_classes(model)
    for module in shard_units(model, blocks):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if empty:
        model.to_empty(device=setup.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, loaded, options=options)
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
    return model


def materialize(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Give a model built on the meta device uninitialised storage on ``device`` (to be filled
    from rank 0), tying again the weights that allocating separates (tied input and output
    embeddings become two parameters otherwise)."""
    model = model.to_empty(device=device)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    return model


@dataclass(frozen=True)
class TorchParallelism:
    """Strategies of PyTorch itself (and a single worker, ``wrap=None``): the optimizer steps the
    parameters as they are; FSDP's are DTensors, which ``torch.distributed.checkpoint`` gathers."""

    wrap: Callable[[torch.nn.Module, ParallelSetup], torch.nn.Module] | None
    sharded: bool = False

    @property
    def weights_from_rank0(self) -> bool:
        """DDP and FSDP fill every worker from rank 0; a single worker loads its own."""
        return self.wrap is not None

    def prepare(
        self, model: torch.nn.Module, make_optimizer: MakeOptimizer, setup: ParallelSetup
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Place and wrap (or shard), then build the optimizer over what the loop runs."""
        import torch

        if setup.device.type == "cuda":
            torch.cuda.set_device(setup.device)
        model = self.wrap(model, setup) if self.wrap is not None else model.to(setup.device)
        return model, make_optimizer(model)

    def accumulating(self, model: torch.nn.Module, *, last: bool) -> contextlib.AbstractContextManager[None]:
        """DDP skips its all-reduce on every micro-batch but the last of a step; FSDP reduces
        (reduce-scatters) every micro-batch, so that no worker ever holds whole gradients."""
        no_sync = getattr(model, "no_sync", None)
        if last or no_sync is None:
            return contextlib.nullcontext()
        return cast("contextlib.AbstractContextManager[None]", no_sync())

    def backward(self, model: torch.nn.Module, loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        """``loss.backward()``, through the fp16 loss scaler when there is one."""
        scaled = scaler.scale(loss) if scaler is not None else loss
        scaled.backward()  # type: ignore[no-untyped-call] # torch leaves Tensor.backward unannotated

    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        max_grad_norm: float | None,
    ) -> float:
        """Unscale (fp16), clip the global norm, step, and clear the gradients."""
        import torch

        params = [p for p in model.parameters() if p.requires_grad]
        if scaler is not None:
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else math.inf)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def model_state(self, model: torch.nn.Module, method: str, rank: int) -> dict[str, torch.Tensor] | None:
        """Copied from the live parameters on rank 0; gathered (every rank joins) under FSDP."""
        if not self.sharded:
            return cpu_copy(_local_model_state(unwrap(model), method)) if rank == 0 else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if method == "lora":
            # One all-gather per parameter, in the same order on every rank.
            gathered = {name: cast("DTensor", p).full_tensor() for name, p in named_trainable(unwrap(model))}
            return {name: t.detach().cpu() for name, t in gathered.items()} if rank == 0 else None
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        whole = cast("dict[str, torch.Tensor]", dict(state))  # full_state_dict: plain whole tensors
        return retie(whole, model) if rank == 0 else None

    def optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int
    ) -> dict[str, Any] | None:
        """``get_optimizer_state_dict``: copied on rank 0, gathered (every rank joins) under FSDP."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if not self.sharded:
            if rank != 0:
                return None
            # Plain tensors come back as the live state itself: copied, so that training may go on.
            live = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
            return dict(cpu_copy(live))
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        gathered = get_optimizer_state_dict(model, optimizer, options=options)
        return dict(gathered) if rank == 0 else None

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
    ) -> None:
        """``set_optimizer_state_dict``, which shards as it loads. Checkpoints written before
        states were keyed by name (keyed by position) load as they were saved."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if all(isinstance(key, int) for key in saved.get("state", {})) and not self.sharded:
            optimizer.load_state_dict(saved)
            return
        set_optimizer_state_dict(model, optimizer, saved, options=StateDictOptions(full_state_dict=True))

    def whole_weights(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """FSDP's units gathered once (:mod:`rayft.training.strategies.gathered`); DDP's are whole already."""
        return fsdp_whole(model) if self.sharded else contextlib.nullcontext()


def block_classes(model: torch.nn.Module) -> frozenset[str]:
    """Class names of the model's transformer blocks: the modules transformers never splits
    across devices (``_no_split_modules``), looked up through PEFT and DDP wrappers."""
    base = base_model(model)
    names = frozenset(getattr(base, "_no_split_modules", None) or ())
    if not names:
        raise TrainingError(
            f"train.strategy=fsdp: {type(base).__name__} does not name its transformer blocks "
            "(transformers' _no_split_modules), so rayft cannot tell what to shard; use train.strategy=ddp"
        )
    return names


def shard_units(model: torch.nn.Module, blocks: Iterable[str]) -> list[torch.nn.Module]:
    """The submodules that become FSDP units of their own, in module order: every instance of a
    block class (not nested in another one)."""
    wanted = frozenset(blocks)
    units: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        if type(module).__name__ in wanted and not any(name.startswith(f"{p}.") for p, _ in units):
            units.append((name, module))
    if not units:
        raise TrainingError(f"train.strategy=fsdp: the model holds no module of the classes {sorted(wanted)}")
    return [module for _, module in units]


def trainable_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters the optimizer updates, as a checkpoint stores them."""
    return [name for name, _ in named_trainable(unwrap(model))]


def retie(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
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


def _local_model_state(model: torch.nn.Module, method: str) -> dict[str, torch.Tensor]:
    if method == "lora":
        trained: dict[str, torch.Tensor] = dict(named_trainable(unwrap(model)))
        return trained
    return dict(model.state_dict())


def check_full_shapes(state: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Refuse to save a model state that is not whole: every tensor must have its parameter's
    full shape (a shard's shape would save one rank's slice), and a LoRA state must hold every
    trained parameter (an empty adapter saves nothing)."""
    shapes = {name: full_shape(p) for name, p in unwrap(model).named_parameters()}
    wrong = [
        f"{name}: {tuple(t.shape)} instead of {shapes[name]}"
        for name, t in state.items()
        if name in shapes and tuple(t.shape) != shapes[name]
    ]
    missing = sorted(set(trainable_names(model)) - set(state))
    if wrong or missing:
        detail = "; ".join(wrong[:3] + [f"missing {m}" for m in missing[:3]])
        raise TrainingError(f"refusing to save a checkpoint that is not the whole model: {detail}")


def cpu_copy(value: T) -> T:
    """A deep copy of ``value`` whose tensors are detached CPU copies (shared storage stays shared)."""
    import torch

    memo: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}

    def copy(item: object) -> object:
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

    return cast("T", copy(value))  # the same structure, a copy of each tensor in place of the tensor
