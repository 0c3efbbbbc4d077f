"""A custom task (rayft.custom): its config section, loading it by import path, its index units, and
the objective that runs it: weighted losses and metrics, model files that restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.custom import TaskData, load_task, resolve_task_path
from rayft.errors import ConfigError, DataError

TASK_SOURCE = """
from dataclasses import dataclass

import torch

from rayft.custom import TaskData


@dataclass(frozen=True)
class Linear:
    features: int = 3

    def build_model(self):
        return torch.nn.Linear(self.features, 2)

    def build_datasets(self, seed):
        g = torch.Generator().manual_seed(seed)
        xs = torch.randn(10, self.features, generator=g)
        return TaskData(train=[(x, int(x.sum() > 0)) for x in xs], validation=[(x, 1) for x in xs[:5]])

    def collate(self, examples):
        return {"x": torch.stack([x for x, _ in examples]), "y": torch.tensor([y for _, y in examples])}

    def loss(self, model, batch):
        return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    def metrics(self, model, batch):
        return {"accuracy": float((model(batch["x"]).argmax(-1) == batch["y"]).float().mean())}
"""


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "linear_task.py"
    path.write_text(TASK_SOURCE)
    return path


def test_the_task_section_takes_a_module_or_a_file_and_names_a_bad_path() -> None:
    assert load_config(None, ["task.path=examples/digits_cnn/task.py:DigitsTask"]).task.path
    assert load_config(None, ["task.path=my_pkg.tasks:Cnn"]).task.path == "my_pkg.tasks:Cnn"
    with pytest.raises(ConfigError, match=r"task.path='my_pkg.tasks' is not 'package.module:Class'"):
        load_config(None, ["task.path=my_pkg.tasks"])


def test_a_task_refuses_model_data_and_sharded_strategies_and_its_dump_reloads(tmp_path: Path) -> None:
    from rayft.config import dump_config

    with pytest.raises(ConfigError, match=r"also sets model, data; remove them"):
        load_config(None, ["task.path=a.b:C", "model.name=gpt2", "data.max_seq_length=64"])
    with pytest.raises(ConfigError, match=r"train.strategy='fsdp': a custom task .* set train.strategy=ddp"):
        load_config(None, ["task.path=a.b:C", "train.strategy=fsdp"])
    cfg = load_config(None, ["task.path=a.b:C", "task.options={width: 8}"])
    dumped = tmp_path / "config.yaml"
    dumped.write_text(dump_config(cfg))
    assert load_config(dumped, []).task == cfg.task


def test_load_task_from_a_file_with_options(task_file: Path) -> None:
    task = load_task(f"{task_file}:Linear", {"features": 4})
    data = task.build_datasets(0)
    assert len(data.train) == 10 and data.validation is not None and len(data.validation) == 5
    assert task.build_model().in_features == 4
    again = load_task(f"{task_file}:Linear", {"features": 4}).build_datasets(0)
    assert all(a[0].equal(b[0]) for a, b in zip(data.train, again.train, strict=True))  # same on every process


def test_load_task_errors_say_what_to_fix(task_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such file .*missing.py; give the .py file"):
        load_task(f"{tmp_path / 'missing.py'}:Linear")
    with pytest.raises(ConfigError, match=r"defines no 'Nope'; check the class name"):
        load_task(f"{task_file}:Nope")
    with pytest.raises(ConfigError, match=r"Linear\(\*\*task.options\) failed with TypeError.*fix task.options"):
        load_task(f"{task_file}:Linear", {"width": 3})
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module_xyz'.*PYTHONPATH"):
        load_task("no_such_module_xyz:Task")
    with pytest.raises(ConfigError, match=r"TaskData lacks build_model, build_datasets, collate, loss, metrics"):
        load_task("rayft.custom:TaskData", {"train": []})


def test_a_relative_task_file_is_made_absolute_for_the_workers(tmp_path: Path) -> None:
    assert resolve_task_path("tasks/t.py:T", tmp_path) == f"{tmp_path / 'tasks' / 't.py'}:T"
    assert resolve_task_path("/abs/t.py:T", tmp_path) == "/abs/t.py:T"
    assert resolve_task_path("pkg.mod:T", tmp_path) == "pkg.mod:T"


def test_task_units_index_every_example_of_both_splits(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from rayft.training.methods.task.method import write_task_units

    prepared = write_task_units(tmp_path / "units", TaskData(train=list(range(7)), validation=[0, 1]), key="k")
    assert prepared.train.num_units == 7 and prepared.validation is not None
    assert prepared.validation.num_units == 2
    ids = [unit["sample_ids"][0] for f in prepared.train.files for unit in pq.read_table(f).to_pylist()]
    assert ids == list(range(7))
    assert write_task_units(tmp_path / "units", TaskData(train=[1]), key="k").validation is None
    with pytest.raises(DataError, match="returned no training examples"):
        write_task_units(tmp_path / "units", TaskData(train=[]), key="k")


def test_task_units_live_in_the_data_cache_written_once_per_pair_of_sizes(tmp_path: Path) -> None:
    from rayft.training.methods.task.method import write_task_units

    cache = tmp_path / "cache"
    first = write_task_units(cache, TaskData(train=list(range(5)), validation=[0]), key="a")
    written = {f: Path(f).stat().st_mtime_ns for f in first.train.files}
    again = write_task_units(cache, TaskData(train=list("abcde"), validation=["x"]), key="b")
    assert again.train.files == first.train.files and all(Path(f).parent.parent.parent == cache for f in written)
    assert {f: Path(f).stat().st_mtime_ns for f in again.train.files} == written  # reused, not rewritten
    assert write_task_units(cache, TaskData(train=list(range(6))), key="c").train.files != first.train.files
    assert sorted(p.name for p in cache.iterdir()) == ["task-units-v1-5-1", "task-units-v1-6-0"]  # no staging left


def test_batches_move_nested_tensors_and_count_examples() -> None:
    import torch

    from rayft.training.methods.task.method import TaskBatch, to_device, weighted_means

    batch = TaskBatch({"x": torch.ones(2), "pair": (torch.zeros(1), "label")}, [4, 7])
    moved = batch.to("meta")
    assert moved.data["x"].device.type == "meta" and moved.data["pair"][1] == "label"
    assert (batch.num_label_tokens, batch.num_tokens, batch.num_computed_tokens) == (2, 2, 2)
    assert to_device([torch.ones(1)], "meta")[0].is_meta
    assert weighted_means([3.0, 1.5], 3.0, ["loss", "accuracy"]) == {"loss": 1.0, "accuracy": 0.5}


def test_evaluation_and_step_loss_do_not_depend_on_the_batch_split(task_file: Path) -> None:
    import torch

    from rayft.training.methods.task.method import TaskObjective
    from rayft.training.modeling.precision import Precision

    task = load_task(f"{task_file}:Linear")
    torch.manual_seed(0)
    objective = TaskObjective(task, task.build_datasets(0), "task: {}\n")
    model = objective.build_model(None, device_type="cpu", weights=True)
    units = [{"sample_ids": [i]} for i in range(5)]
    cpu, fp32 = torch.device("cpu"), Precision(None, False)
    whole = objective.evaluate(model, units, batch_size=5, precision=fp32, device=cpu, lockstep=False)
    split = objective.evaluate(model, units, batch_size=2, precision=fp32, device=cpu, lockstep=False)
    assert whole.keys() == {"eval/loss", "eval/accuracy"}
    assert split == pytest.approx(whole, abs=1e-6)
    train_units = [{"sample_ids": [i]} for i in range(10)]
    one = objective.loss_sum(model, objective.collate(train_units), fp32)
    parts = sum(objective.loss_sum(model, objective.collate(train_units[i : i + 3]), fp32) for i in (0, 3, 6, 9))
    assert float(one.detach()) == pytest.approx(float(parts.detach()), abs=1e-5)


def test_task_model_files_restore_the_weights(task_file: Path, tmp_path: Path) -> None:
    import torch

    from rayft.training.methods.task.method import TaskObjective

    task = load_task(f"{task_file}:Linear")
    objective = TaskObjective(task, task.build_datasets(0), "task:\n  path: x\n")
    model = objective.build_model(None, device_type="cpu", weights=True)
    objective.write_model(model, tmp_path / "ckpt", None)
    assert (tmp_path / "ckpt" / "rayft_config.yaml").read_text().startswith("task:")
    torch.manual_seed(123)
    restored = objective.build_model(tmp_path / "ckpt", device_type="cpu", weights=True)
    assert all(a.equal(b) for a, b in zip(model.state_dict().values(), restored.state_dict().values(), strict=True))
