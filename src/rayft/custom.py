"""Bring your own model: the protocol of a custom task that rayft's training loop runs.

A task builds the model, the datasets, the batches, the loss and the evaluation metrics; rayft runs
everything else exactly as for a causal LM: the workers (in-process, or Ray Train with DDP), the
deterministic data order and its exact resume, checkpoints (weights, optimizer, scheduler, RNG,
manifest last), restarts after a worker dies, the learning-rate schedule, gradient accumulation and
clipping, and the metric sinks (metrics.jsonl, TensorBoard, MLflow, W&B, Prometheus).

A config selects the task by import path, and passes it its options::

    task:
      path: examples/digits_cnn/task.py:DigitsTask   # or package.module:Class
      options: {width: 16}

The class is instantiated as ``Class(**options)`` on the driver and on every worker. What it must
guarantee: :meth:`CustomTask.build_datasets` returns the same examples in the same order on every
process for a given seed (rayft shards and shuffles them by index), and :meth:`CustomTask.build_model`
initialises from the torch seed rayft sets before calling it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rayft.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TaskData:
    """A task's examples: any sequences (lists, numpy arrays, torch datasets with ``len`` and
    indexing). ``validation`` is evaluated every ``train.eval_steps`` and at the end."""

    train: Sequence[Any]
    validation: Sequence[Any] | None = None


@runtime_checkable
class CustomTask(Protocol):
    """What a custom task provides. Losses and metrics are means over the batch's examples: rayft
    weighs them by the examples of each micro-batch, so a step's update and an evaluation's figures
    are the same whatever the split into workers and micro-batches."""

    def build_model(self) -> torch.nn.Module:
        """A fresh model (on the CPU; rayft places it). Called after rayft seeds torch, on every worker."""
        ...

    def build_datasets(self, seed: int) -> TaskData:
        """The training and validation examples; the same on every process for the same seed."""
        ...

    def collate(self, examples: list[Any]) -> Any:
        """A batch from a list of examples: a tensor, or a dict / list / tuple of tensors (moved to the
        worker's device by rayft)."""
        ...

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The mean loss over the batch's examples (a scalar tensor with a gradient)."""
        ...

    def metrics(self, model: torch.nn.Module, batch: Any) -> Mapping[str, float]:
        """Evaluation figures of one batch, each a mean over its examples (e.g. ``{"accuracy": 0.9}``);
        logged as ``eval/<name>`` beside ``eval/loss``. Called in eval mode, without gradients."""
        ...


def load_task(path: str, options: Mapping[str, Any] | None = None) -> CustomTask:
    """Import the task class named by ``path`` ('package.module:Class' or 'file.py:Class') and
    instantiate it with ``options``; errors say what failed and how to fix it."""
    target, _, name = path.rpartition(":")
    module = _import_file(target, path) if target.endswith(".py") else _import_module(target, path)
    cls = getattr(module, name, None)
    if cls is None:
        raise ConfigError(f"task.path={path!r}: {target} defines no {name!r}; check the class name after the colon")
    try:
        task = cls(**dict(options or {}))
    except Exception as exc:  # the task's own validation of its options
        raise ConfigError(
            f"task.path={path!r}: {name}(**task.options) failed with {type(exc).__name__}: {exc}; fix task.options"
        ) from exc
    missing = [m for m in ("build_model", "build_datasets", "collate", "loss", "metrics") if not callable(
        getattr(task, m, None))]  # fmt: skip
    if missing:
        raise ConfigError(
            f"task.path={path!r}: {name} lacks {', '.join(missing)} of rayft.custom.CustomTask; define "
            f"{'them' if len(missing) > 1 else 'it'}"
        )
    return task  # type: ignore[no-any-return]


def resolve_task_path(path: str, cwd: Path) -> str:
    """``path`` with a relative .py file made absolute against ``cwd`` (the driver's working
    directory), so that workers whose working directory differs import the same file."""
    target, _, name = path.rpartition(":")
    if not target.endswith(".py") or Path(target).is_absolute():
        return path
    return f"{(cwd / target).resolve()}:{name}"


def _import_module(module: str, path: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"task.path={path!r}: cannot import {module!r} ({exc}); install the package, add its directory to "
            "PYTHONPATH, or give the file instead (path/to/file.py:Class)"
        ) from exc


def _import_file(file: str, path: str) -> Any:
    source = Path(file).expanduser().resolve()
    if not source.is_file():
        raise ConfigError(
            f"task.path={path!r}: no such file {source}; give the .py file relative to the working directory "
            "(or absolute)"
        )
    # One module per file, under a name of its own (dataclasses and pickling look classes up there).
    name = f"rayft_task_{source.stem}_{hashlib.sha1(str(source).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, source)
    if spec is None or spec.loader is None:
        raise ConfigError(f"task.path={path!r}: {source} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module
