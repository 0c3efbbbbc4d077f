"""The run location travels as one value: built where the run starts, carried by the worker plan to
the workers, and unchanged by the plan file ``torchrun`` reads."""

from __future__ import annotations

from pathlib import Path

from rayft.config import CheckpointConfig, LoggingConfig, LoraConfig, ModelConfig, TrainConfig
from rayft.runs.location import RunLocation
from rayft.runs.store import open_store
from rayft.training.driver.torchrun import read_plan, write_plan
from rayft.training.loop.plan import Schedule
from rayft.training.loop.worker_plan import WorkerPlan


def plan_at(location: RunLocation) -> WorkerPlan:
    return WorkerPlan(
        model=ModelConfig(), lora=LoraConfig(), train=TrainConfig(), logging=LoggingConfig(),
        checkpoint=CheckpointConfig(), seed=0, location=location, resolved_config="",
        schedule=Schedule(1, 1, 1, 1, 0), shuffle_window=1, has_validation=False,
    )  # fmt: skip


def test_the_torchrun_plan_file_keeps_the_run_directory(tmp_path: Path) -> None:
    plan = plan_at(RunLocation(tmp_path / "run"))
    write_plan(tmp_path / "plan.json", plan, {"train": ["a.parquet"]})
    read, files = read_plan(tmp_path / "plan.json")
    assert read.location == RunLocation(tmp_path / "run") and read.run_dir == tmp_path / "run"
    assert files == {"train": ["a.parquet"]}


def test_a_store_hands_back_the_location_it_was_opened_at(tmp_path: Path) -> None:
    local = RunLocation(tmp_path / "run")
    remote = RunLocation(tmp_path / "mirror", (tmp_path / "bucket" / "run").as_uri())
    assert open_store(local).location == local
    assert open_store(remote).location == remote and open_store(remote).local_dir == tmp_path / "mirror"


def test_a_worker_on_a_node_keeps_the_uri_and_takes_a_directory_of_its_node(tmp_path: Path) -> None:
    uri = "s3://bucket/runs/demo?secret_key=abcdef123456"
    on_node = plan_at(RunLocation(tmp_path / "mirror", uri)).location.on_node(tmp_path / "cache")
    assert on_node.remote_uri == uri and on_node.local_dir.is_relative_to(tmp_path / "cache")
    assert "abcdef123456" not in on_node.display
