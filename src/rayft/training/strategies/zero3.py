"""DeepSpeed ZeRO stage 3 as a ``train.strategy`` (``pip install 'rayft[deepspeed]'``).

DeepSpeed's engine partitions weights, gradients and optimizer state over the workers and runs the
backward pass and the optimizer step. rayft keeps what it does for every strategy: it builds the
torch AdamW (whose learning rate its scheduler sets), accumulates micro-batches itself (telling the
engine which one ends a step, so that the loss normalisation by the step's real tokens stays
exact), and writes checkpoints in its own layout: whole weights and the optimizer state keyed by
parameter name, gathered with DeepSpeed's full-state functions. So a ZeRO-3 run resumes under DDP
or FSDP, and back.

Objectives that sample (GRPO) gather the whole weights before the workers sample and take the engine's
per-module hooks off meanwhile (:func:`rayft.training.strategies.gathered.zero3_whole`).

The engine's settings come from ``train.*`` (micro-batch size, clipping, precision); entries of
``train.deepspeed`` are merged over them (offload, bucket sizes, ...).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

from rayft.errors import TrainingError
from rayft.training.modeling.model import full_shape, named_trainable, parameter_group_names
from rayft.training.strategies.gathered import zero3_whole
from rayft.training.strategies.parallel import MakeOptimizer, ParallelSetup, retie

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "pip install 'rayft[deepspeed]'"


class ZeroOptimizer(Protocol):
    """What rayft reads of the engine's ZeRO-3 optimizer (``DeepSpeedZeroOptimizer_Stage3``)."""

    fp32_partitioned_groups_flat: list[torch.Tensor]  # this rank's fp32 partition of each parameter group


class ZeroEngine(Protocol):
    """What rayft uses of DeepSpeed's engine (``deepspeed.DeepSpeedEngine``, a ``torch.nn.Module``), typed
    here because DeepSpeed ships no type information."""

    module: torch.nn.Module  # the model it wraps
    optimizer: ZeroOptimizer

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Whether the next backward ends the step (then it reduces the gradients)."""
        ...

    def backward(self, loss: torch.Tensor) -> object:
        """Back-propagate ``loss``, scaled for fp16 by the engine."""
        ...

    def step(self) -> None:
        """Clip, step the optimizer (at a boundary) and clear the gradients."""
        ...

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last step, before clipping."""
        ...


def engine_of(model: torch.nn.Module) -> ZeroEngine:
    """The engine :meth:`DeepSpeedZero3.prepare` returned, as the loop hands it back."""
    return cast("ZeroEngine", model)


def deepspeed_config(
    *, micro_batch_size: int, world_size: int, max_grad_norm: float | None, autocast: str | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The engine's config: rayft's settings, with ``extra`` (``train.deepspeed``) merged over them.

    ``autocast`` is "bf16", "fp16" or None (full precision).
    """
    base: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        # rayft accumulates micro-batches itself and marks the last one of each step.
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch_size * world_size,
        "gradient_clipping": max_grad_norm or 0.0,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": autocast == "bf16"},
        "fp16": {"enabled": autocast == "fp16"},
        # The optimizer is torch's AdamW, also when the optimizer state is offloaded to the CPU.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,  # rayft logs every step itself
        "wall_clock_breakdown": False,
    }
    return merge(base, extra)


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged over it, nested mappings key by key."""
    merged = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def import_deepspeed() -> ModuleType:
    """The ``deepspeed`` package, or an error with the install line."""
    try:
        import deepspeed
    except ImportError as exc:
        raise TrainingError(
            f"train.strategy=deepspeed needs DeepSpeed on every worker ({exc}); install it with: {INSTALL_HINT}"
        ) from exc
    return cast("ModuleType", deepspeed)  # no type information: DeepSpeed ships none


def skip_inference_comm_kernel(deepspeed: ModuleType) -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce kernel when it joins the process group.

    On the CPU, DeepSpeed's communication backend compiles that C++ kernel the first time it starts
    in an environment (23 s of wall time and over 40 s of CPU on 2 cores, and a compiler, which a laptop
    may lack). Only its inference all-reduce uses it; training reduces through the process group.
    DeepSpeed reads the kernel's entry in its table of compatible ops (one module-level dict, which
    it keeps so that edits persist) and skips the build where it is false.
    """
    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


class DeepSpeedZero3:
    """The ``deepspeed`` strategy: a DeepSpeed engine in ZeRO stage 3 (see the module docstring)."""

    sharded = True
    weights_from_rank0 = False  # every worker loads the weights (DeepSpeed's zero.Init is not used)

    def prepare(
        self, model: torch.nn.Module, make_optimizer: MakeOptimizer, setup: ParallelSetup
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Build the torch optimizer, then the engine around model and optimizer; the torch
        optimizer is returned, as the scheduler sets its learning rate."""
        import torch
        import torch.distributed as dist

        deepspeed = import_deepspeed()
        if setup.device.type == "cuda":
            torch.cuda.set_device(setup.device)
        skip_inference_comm_kernel(deepspeed)
        deepspeed.init_distributed(dist_backend=dist.get_backend())  # joins the process group Ray set up
        optimizer = make_optimizer(model)
        dtype = setup.precision.autocast_dtype
        autocast = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype) if dtype is not None else None
        config = deepspeed_config(
            micro_batch_size=setup.micro_batch_size, world_size=setup.world_size,
            max_grad_norm=setup.max_grad_norm, autocast=autocast, extra=setup.deepspeed,
        )  # fmt: skip
        engine: torch.nn.Module = deepspeed.initialize(model=model, optimizer=optimizer, config=config)[0]
        return engine, optimizer

    @contextlib.contextmanager
    def accumulating(self, model: torch.nn.Module, *, last: bool) -> Iterator[None]:
        """Tell the engine whether this micro-batch ends the step (it then reduces and may step)."""
        engine_of(model).set_gradient_accumulation_boundary(last)
        yield

    def backward(self, model: torch.nn.Module, loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
        """The engine's backward (it scales fp16 losses itself; ``scaler`` is not used)."""
        engine_of(model).backward(loss)

    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        max_grad_norm: float | None,
    ) -> float:
        """The engine clips (``gradient_clipping``), steps and clears the gradients."""
        engine = engine_of(model)
        engine.step()
        norm = engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def model_state(self, model: torch.nn.Module, method: str, rank: int) -> dict[str, torch.Tensor] | None:
        """Every rank gathers each parameter's fp32 master copy; rank 0 keeps them."""
        from deepspeed.utils import safe_get_full_fp32_param

        module = engine_of(model).module
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad or method == "full"]
        gathered = {name: safe_get_full_fp32_param(p) for name, p in params}  # collectives, same order everywhere
        if rank != 0:
            return None
        state = {name: t.detach().cpu().clone().reshape(full_shape(p)) for (name, p), t in zip(
            params, gathered.values(), strict=True)}  # fmt: skip
        if method == "lora":
            return state
        buffers = {name: b.detach().cpu().clone() for name, b in module.named_buffers() if name in module.state_dict()}
        return retie({**state, **buffers}, module)

    def optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int
    ) -> dict[str, Any] | None:
        """The full optimizer state dict of ``torch.distributed.checkpoint`` (keyed by parameter
        name, with the groups of :func:`rayft.training.modeling.model.parameter_groups`), gathered from
        the partitions by every rank."""
        from deepspeed.utils import safe_get_full_optimizer_state

        module = engine_of(model).module
        trainable = named_trainable(module)
        step = _adam_step(optimizer)
        keys = sorted(k for k in next(iter(optimizer.state.values())) if k != "step")
        state: dict[str, Any] = {}
        for name, param in trainable:  # collectives, same order everywhere
            values = {key: safe_get_full_optimizer_state(param, key) for key in keys}
            if rank == 0:
                shape = full_shape(param)  # ZeRO-3's whole shape (ds_shape), not its emptied tensor's
                state[name] = {
                    "step": step.clone(),
                    **{k: v.detach().cpu().clone().reshape(shape) for k, v in values.items()},
                }
        if rank != 0:
            return None
        groups = [
            {**{k: copy.deepcopy(v) for k, v in group.items() if k != "params"}, "params": names}
            for group, names in zip(optimizer.param_groups, parameter_group_names(module), strict=True)
        ]
        return {"state": state, "param_groups": groups}

    def load_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
    ) -> None:
        """Each rank copies its partition of every saved tensor; the step count and the groups'
        settings are restored too."""
        from deepspeed.utils import safe_set_full_optimizer_state

        module = engine_of(model).module
        trainable = named_trainable(module)
        missing = [n for n, _ in trainable if n not in saved["state"]]
        if missing:
            raise TrainingError(f"the checkpoint's optimizer state has no entry for {missing[:3]}")
        _create_adam_state(
            engine_of(model).optimizer, optimizer, keys=[k for k in saved["state"][trainable[0][0]] if k != "step"]
        )
        for name, param in trainable:
            for key, value in saved["state"][name].items():
                if key != "step":
                    safe_set_full_optimizer_state(param, value.to(param.device).float().flatten(), key)
        step = next(iter(saved["state"].values()))["step"]
        for partition_state in optimizer.state.values():
            partition_state["step"] = step.clone().to(partition_state["step"].device)
        for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
            group.update({k: v for k, v in saved_group.items() if k != "params"})

    def whole_weights(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Every parameter gathered at once and the engine's per-module hooks off, so that sampling's forwards
        run no collective (:func:`rayft.training.strategies.gathered.zero3_whole`)."""
        return zero3_whole(model)


def _create_adam_state(zero_optimizer: ZeroOptimizer, optimizer: torch.optim.Optimizer, keys: list[str]) -> None:
    """Create the AdamW state of each fp32 partition, as AdamW does on its first step (it is
    created lazily; DeepSpeed copies a checkpoint's values into it)."""
    import torch

    for flat in zero_optimizer.fp32_partitioned_groups_flat:
        state = optimizer.state[flat]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state.update({key: torch.zeros_like(flat, memory_format=torch.preserve_format) for key in keys})


def _adam_step(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The step count of the partitions' AdamW state (the same for all of them)."""
    import torch

    steps = {float(s["step"]) for s in optimizer.state.values()}
    if len(steps) != 1:
        raise TrainingError(f"DeepSpeed's optimizer partitions disagree on the step count: {sorted(steps)}")
    return torch.tensor(steps.pop(), dtype=torch.float32)
