"""`rayft train` under torchrun: what it refuses before any process group starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError
from rayft.training.driver.torchrun import check_torchrun_run, launched_by_torchrun


def test_torchrun_workers_are_recognised_by_their_environment() -> None:
    assert launched_by_torchrun({"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "2", "RANK": "0"})
    assert not launched_by_torchrun({"WORLD_SIZE": "2", "RANK": "0"})  # a Ray Train worker sets these too
    assert not launched_by_torchrun({})


def test_the_world_size_must_be_num_workers(tmp_path: Path) -> None:
    cfg = load_config(None, ["scaling.num_workers=4", f"storage_path={tmp_path}"])
    assert check_torchrun_run(cfg, 4).local_dir == tmp_path / "rayft-run"
    with pytest.raises(ConfigError, match=r"torchrun started 2 processes but scaling.num_workers is 4; set scaling"):
        check_torchrun_run(cfg, 2)


def test_a_uri_storage_path_is_refused_under_torchrun() -> None:
    cfg = load_config(None, ["scaling.num_workers=2", "storage_path=s3://bucket/runs"])
    with pytest.raises(ConfigError, match=r"storage_path='s3://bucket/runs/rayft-run': under torchrun every rank"):
        check_torchrun_run(cfg, 2)


def test_a_custom_task_is_refused_under_torchrun(tmp_path: Path) -> None:
    cfg = load_config(None, ["scaling.num_workers=2", f"storage_path={tmp_path}", "task.path=pkg.mod:Task"])
    with pytest.raises(ConfigError, match=r"task.path='pkg.mod:Task': a custom task trains on Ray .* torchrun"):
        check_torchrun_run(cfg, 2)
