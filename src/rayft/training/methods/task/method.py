"""A custom task (``task.path``: a :class:`rayft.custom.CustomTask`) as a training method: its model, batches,
loss and metrics over example indices (:func:`task_units`), which the loop shards, shuffles and resumes as it
does token units."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from rayft.data.prepared import PreparedData, PreparedSplit
from rayft.errors import DataError
from rayft.files import publish_dir_once, staging_dir
from rayft.runs import layout
from rayft.security import redact
from rayft.training.loop.batches import TrainBatch, Unit, micro_batches
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.session import all_reduce_sum
from rayft.training.modeling.model import unwrap

if TYPE_CHECKING:
    import torch

    from rayft.custom import CustomTask, TaskData
    from rayft.training.modeling.precision import Precision

T = TypeVar("T")

TASK_WEIGHTS_FILE = "model.safetensors"
_UNITS_PER_FILE = 4096


def task_units(num_examples: int) -> list[dict[str, Any]]:
    """The training units of a task's split: one per example, its index as the sample id (one
    loss term each)."""
    return [{"sample_ids": [index], "num_tokens": 1, "num_label_tokens": 1} for index in range(num_examples)]


def write_task_units(cache: Path, data: TaskData, key: str) -> PreparedData:
    """The index units of a task's splits as parquet files under ``cache`` (the data cache), so that
    the loop shards, shuffles and resumes a task's examples exactly as it does token units, and every
    worker reads them where it reads prepared data. They depend only on the split sizes, so a
    directory per pair of sizes is written once (staged, then renamed; the first writer wins) and
    reused by every run and trial."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sizes = {"train": len(data.train), "validation": len(data.validation or ())}
    if not sizes["train"]:
        raise DataError("the task's build_datasets returned no training examples; return a non-empty train sequence")
    directory = cache / f"task-units-v1-{sizes['train']}-{sizes['validation']}"
    if not (directory / "train").is_dir():
        staging = staging_dir(directory)
        for name, count in sizes.items():
            units = task_units(count)
            for index, start in enumerate(range(0, count, _UNITS_PER_FILE)):
                (staging / name).mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.Table.from_pylist(units[start : start + _UNITS_PER_FILE]),
                               staging / name / f"part-{index:05d}.parquet")  # fmt: skip
        publish_dir_once(staging, directory)
    splits: dict[str, PreparedSplit | None] = {"train": None, "validation": None}
    for name, count in sizes.items():
        if count:
            files = [str(directory / name / f"part-{i:05d}.parquet") for i in range(-(-count // _UNITS_PER_FILE))]
            splits[name] = PreparedSplit.of(files, task_units(count))
    assert splits["train"] is not None
    return PreparedData(key, str(directory), splits["train"], splits["validation"], packed=False, max_seq_length=1)


@dataclass(frozen=True)
class TaskBatch:
    """A task's collated batch, with the counts the loop reads (every example is one loss term)."""

    data: object  # what the task's collate() made, in whatever form its loss and metrics read
    sample_ids: list[int]

    @property
    def num_label_tokens(self) -> int:
        """Loss terms: the examples."""
        return len(self.sample_ids)

    num_tokens = num_label_tokens
    num_computed_tokens = num_label_tokens

    def to(self, device: torch.device) -> TaskBatch:
        """The same batch with its tensors on ``device``."""
        return replace(self, data=to_device(self.data, device))


def to_device(data: T, device: torch.device) -> T:
    """``data`` with every tensor in it (nested in dicts, lists and tuples) moved to ``device``."""
    move = getattr(data, "to", None)
    if callable(move) and not isinstance(data, type):
        return cast("T", move(device))
    if isinstance(data, Mapping):
        return cast("T", {key: to_device(value, device) for key, value in data.items()})
    if isinstance(data, list | tuple):
        return cast("T", type(data)(to_device(value, device) for value in data))
    return data


def weighted_means(sums: Sequence[float], count: float, names: Sequence[str]) -> dict[str, float]:
    """``{name: sum / count}``: the figures of every worker summed, divided by every worker's examples."""
    return {name: value / max(count, 1.0) for name, value in zip(names, sums, strict=True)}


@dataclass(frozen=True)
class TaskObjective(MethodHooks):
    """A custom task: its model, batches, loss and metrics, over the examples ``data`` holds."""

    task: CustomTask
    data: TaskData
    resolved_config: str
    throughput_unit: str = "examples"
    model_type: str = ""

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The task's model, its weights (and buffers) restored from ``restore_dir`` if given."""
        model = self.task.build_model()
        if restore_dir is not None:
            from safetensors.torch import load_file

            model.load_state_dict(load_file(str(restore_dir / TASK_WEIGHTS_FILE)))
        return model

    def collate(self, units: list[Unit], *, split: str = "train") -> TaskBatch:
        """The examples the units index, collated by the task."""
        examples = self.data.train if split == "train" else self.data.validation
        assert examples is not None  # a validation split exists only when the task returned one
        ids = [int(unit["sample_ids"][0]) for unit in units]
        return TaskBatch(self.task.collate([examples[i] for i in ids]), ids)

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The task's mean loss times the batch's examples."""
        assert isinstance(batch, TaskBatch)  # the loop trains on what collate() made
        with autocast(precision, device_of(batch.data)):
            return self.task.loss(model, batch.data) * batch.num_label_tokens

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """The task's loss and metrics over every worker's validation examples (the module a DDP
        wrapper holds runs, in eval mode, without gradients)."""
        import torch

        inner = unwrap(model)
        was_training = inner.training
        inner.eval()
        names: list[str] = []
        sums: list[float] = []
        count = 0
        with torch.no_grad():
            for batch in self._batches(units, batch_size, device):
                n = batch.num_label_tokens
                with autocast(precision, device):
                    figures = {"loss": float(self.task.loss(inner, batch.data)), **self.task.metrics(inner, batch.data)}
                if not names:
                    names, sums = sorted(figures), [0.0] * len(figures)
                sums = [total + float(figures[name]) * n for total, name in zip(sums, names, strict=True)]
                count += n
        inner.train(was_training)
        *totals, examples = all_reduce_sum([*sums, float(count)], device)
        means = weighted_means(totals, examples, names)
        return {"eval/loss": means.pop("loss"), **{f"eval/{name}": value for name, value in means.items()}}

    def _batches(self, units: Iterable[Unit], batch_size: int, device: torch.device) -> Iterator[TaskBatch]:
        for chunk in micro_batches(iter(units), batch_size):
            yield self.collate(chunk, split="validation").to(device)

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """``model.safetensors`` (every tensor of the state dict, buffers included) and the resolved config."""
        from safetensors.torch import save_file

        state = state_dict if state_dict is not None else unwrap(model).state_dict()
        directory.mkdir(parents=True, exist_ok=True)
        # Own copies: safetensors refuses tensors that share storage.
        save_file({name: t.detach().cpu().clone().contiguous() for name, t in state.items()},
                  str(directory / TASK_WEIGHTS_FILE))  # fmt: skip
        (directory / layout.CHECKPOINT_CONFIG_FILE).write_text(redact(self.resolved_config), encoding="utf-8")


def device_of(data: object) -> torch.device:
    """The device of the first tensor in ``data`` (CPU when it holds none)."""
    import torch

    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, list | tuple) else ()
    return next((device_of(v) for v in values), torch.device("cpu"))


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast to the run's mixed-precision dtype (nothing on CPU, where runs are fp32)."""
    import torch

    if precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.autocast_dtype)
