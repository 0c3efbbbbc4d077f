"""What :func:`rayft.training.modeling.step_choice.choose_step` needs to know, read from this worker:
the model's shape, the device's free memory, the CPU's instructions, the installed kernels."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

from rayft.config.model import ModelConfig
from rayft.training.modeling.step_choice import Method, StepFacts

# Optional kernels the planner may pick when they import (checked without importing them).
KERNEL_PACKAGES = ("flash_attn", "liger_kernel")


def gather_step_facts(
    device_type: str,
    *,
    method: Method,
    hidden_size: int,
    num_layers: int,
    vocab_size: int,
    seq_length: int,
    micro_batch_size: int,
    packing: bool,
    cpus: int,
    special_attention: bool = False,
    sft: bool = True,
    strategy: str = "ddp",
    reference_copy: bool = False,
    dora: bool = False,
) -> StepFacts:
    """The facts for a worker on ``device_type`` training a model of this shape, with what this process
    finds out itself (free memory, CPU bf16 instructions, torch version, installed kernels)."""
    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return StepFacts(
        device_type=device_type, method=method, hidden_size=hidden_size, num_layers=num_layers,
        vocab_size=vocab_size, seq_length=seq_length, micro_batch_size=micro_batch_size, packing=packing,
        free_memory_bytes=free_memory_bytes(device_type), cpus=cpus, cpu_bf16=cpu_has_bf16(), cpu_amx=cpu_has_amx(),
        torch_version=(major, minor), installed=installed_kernels(), special_attention=special_attention, sft=sft,
        strategy=strategy, reference_copy=reference_copy, dora=dora,
    )  # fmt: skip


def model_shape(cfg: ModelConfig) -> dict[str, Any]:
    """Hidden size, layers, vocabulary and whether the attention is special (a sliding window or
    soft-capping), read from the model's config without its weights."""
    from rayft.models.loading import load_model_config

    config = load_model_config(cfg)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {
        "hidden_size": int(getattr(text, "hidden_size", 0) or getattr(text, "d_model", 0) or 0),
        "num_layers": int(getattr(text, "num_hidden_layers", 0) or getattr(text, "num_layers", 0) or 0),
        "vocab_size": int(getattr(text, "vocab_size", 0) or 0),
        "special_attention": bool(
            getattr(text, "sliding_window", None) or getattr(text, "attn_logit_softcapping", None)
        ),
    }


def free_memory_bytes(device_type: str) -> int | None:
    """Free memory of the current CUDA device, or the host's available memory on CPU (None: unknown)."""
    if device_type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return int(free)
    return _host_available()


def _host_available() -> int | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


# The /proc/cpuinfo flags of x86's bf16 products: avx512_bf16's dot-product instruction and AMX's tiles
# (amx_tile: the tile registers, amx_bf16: their bf16 products).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


@functools.cache
def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """Which of :data:`BF16_FLAGS` the CPU has (Linux only: empty where /proc/cpuinfo is missing)."""
    if not cpuinfo.exists():
        return frozenset()
    flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    return frozenset(flag for flag in BF16_FLAGS if flag in flags)


def cpu_has_bf16() -> bool:
    """Whether the CPU has bf16 matrix instructions (x86 avx512_bf16 or AMX; Linux only)."""
    return bool(cpu_bf16_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_amx() -> bool:
    """Whether the CPU multiplies bf16 on AMX tiles (amx_tile and amx_bf16; Linux only)."""
    return {"amx_tile", "amx_bf16"} <= cpu_bf16_flags()


def installed_kernels() -> frozenset[str]:
    """The optional kernel packages of :data:`KERNEL_PACKAGES` that are installed."""
    return frozenset(name for name in KERNEL_PACKAGES if importlib.util.find_spec(name) is not None)


def worker_cpus() -> int:
    """CPUs this process may use: what Ray reserved for it (Ray sets OMP_NUM_THREADS to a task's CPUs), else
    the CPUs it may run on."""
    reserved = os.environ.get("OMP_NUM_THREADS", "")
    if reserved.isdigit() and int(reserved) > 0:
        return int(reserved)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
