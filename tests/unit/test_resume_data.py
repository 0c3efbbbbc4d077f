"""A resume trains on the data its checkpoint was trained on: the prepared data's key is recorded in
every checkpoint, and a resume whose data prepares to another key is refused in one line unless the
config accepts the change (``checkpoint.resume_data_change: accept``)."""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.data.prepared import PreparedData
from rayft.errors import RunStateError, TrainingError
from rayft.runs import layout
from rayft.runs.manifest import read_manifest, write_manifest
from rayft.runs.planner import check_resume_data
from rayft.training.driver.run import RunStart, drive
from rayft.training.driver.startup import run_location
from rayft.training.loop.worker_plan import WorkerPlan


class KilledAfterACheckpoint:
    """Stands for workers that commit one checkpoint, as training's own, then are killed; or finish."""

    uses_ray = False

    def __init__(self, *, killed: bool) -> None:
        self.killed = killed
        self.data_keys: list[str] = []

    def check(self) -> None:
        pass

    def runtime(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        self.data_keys.append(prepared.key)
        if self.killed:
            step = Path(plan.run_dir) / layout.CHECKPOINTS_DIR / layout.step_dir_name(2)
            step.mkdir(parents=True)
            (step / "model.safetensors").write_bytes(b"\0" * 16)
            write_manifest(step, 2, {}, plan.lineage)
            raise TrainingError("killed")
        final = Path(plan.run_dir) / layout.FINAL_DIR
        final.mkdir(parents=True)
        write_manifest(final, 3, {})


def rows(count: int) -> str:
    return "".join(f'{{"prompt": "{i} + 1 =", "completion": " {i + 1}"}}\n' for i in range(count))


@pytest.fixture
def killed_run(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data.jsonl"
    data.write_text(rows(24), encoding="utf-8")
    with pytest.raises(TrainingError, match="killed"):
        drive(
            config(tiny_model_dir, tmp_path),
            KilledAfterACheckpoint(killed=True),
            run_location(config(tiny_model_dir, tmp_path)),
        )
    return data


def config(model_dir: Path, tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, [
        f"model.name={model_dir}", f"storage_path={tmp_path / 'runs'}", "name=run", "scaling.num_workers=0",
        f"data.datasets=[{{path: '{tmp_path / 'data.jsonl'}'}}]", "data.validation_fraction=0",
        "train.micro_batch_size=2", "train.max_steps=3", "lora.r=4", *overrides,
    ])  # fmt: skip


def test_the_checkpoint_records_the_key_of_its_data(killed_run: Path, tmp_path: Path) -> None:
    manifest = read_manifest(tmp_path / "runs" / "run" / layout.CHECKPOINTS_DIR / layout.step_dir_name(2))
    assert manifest is not None and len(manifest.info["data_key"]) == 24


def test_a_resume_on_changed_data_is_refused_in_one_line(
    killed_run: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    killed_run.write_text(rows(25), encoding="utf-8")  # one row appended
    cfg = config(tiny_model_dir, tmp_path)
    launcher = KilledAfterACheckpoint(killed=False)
    with pytest.raises(RunStateError) as caught:
        drive(cfg, launcher, run_location(cfg), start=RunStart(resume=True))
    message = str(caught.value)
    assert "\n" not in message and launcher.data_keys == []
    assert re.search(r"step-000002 was trained on data [0-9a-f]{12}, .* now prepares to [0-9a-f]{12}", message), message
    assert "checkpoint.resume_data_change=accept" in message


def test_a_resume_on_the_same_data_or_an_accepted_change_continues(
    killed_run: Path, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tiny_model_dir, tmp_path, "checkpoint.resume_data_change=accept")
    killed_run.write_text(rows(25), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="rayft"):
        result = drive(cfg, KilledAfterACheckpoint(killed=False), run_location(cfg), start=RunStart(resume=True))
    assert result.steps == 3
    assert any("continuing on the new data" in r.getMessage() for r in caplog.records)


def test_the_data_check_is_a_pure_decision() -> None:
    assert check_resume_data("step-000002", None, "b" * 24, "refuse") is None  # a checkpoint from before keys
    assert check_resume_data("step-000002", "a" * 24, "a" * 24, "refuse") is None
    with pytest.raises(RunStateError, match="resume_data_change=accept"):
        check_resume_data("step-000002", "a" * 24, "b" * 24, "refuse")
    warning = check_resume_data("step-000002", "a" * 24, "b" * 24, "accept")
    assert warning is not None and "continuing on the new data" in warning
