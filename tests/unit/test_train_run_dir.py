"""Claiming a run directory: no silent reuse, resume only what exists and matches."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError, RunStateError, StorageError
from rayft.runs.manifest import write_manifest
from rayft.runs.planner import check_resumable
from rayft.training.driver.startup import claim_run_dir


def cfg(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, [f"storage_path={tmp_path}", "name=demo", *overrides])


def test_a_new_run_saves_its_resolved_config(tmp_path: Path) -> None:
    run_dir = claim_run_dir(cfg(tmp_path), resume=False)
    assert run_dir == tmp_path.resolve() / "demo"
    assert "learning_rate: 0.0002" in (run_dir / "config.yaml").read_text()


def test_reusing_a_name_without_resume_is_refused(tmp_path: Path) -> None:
    run_dir = claim_run_dir(cfg(tmp_path), resume=False)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.0}\n')  # it trained a step
    with pytest.raises(RunStateError, match=r"run 'demo' already exists .*; rerun with --resume .* \(name=demo-2\)"):
        claim_run_dir(cfg(tmp_path), resume=False)


def test_resume_needs_an_existing_unfinished_run(tmp_path: Path) -> None:
    with pytest.raises(RunStateError, match="there is no run at .* to resume"):
        claim_run_dir(cfg(tmp_path), resume=True)
    run_dir = claim_run_dir(cfg(tmp_path), resume=False)
    assert claim_run_dir(cfg(tmp_path), resume=True) == run_dir
    (run_dir / "final").mkdir()
    write_manifest(run_dir / "final", 10)
    with pytest.raises(RunStateError, match="already finished"):
        claim_run_dir(cfg(tmp_path), resume=True)


def test_a_start_that_trained_nothing_is_started_again_keeping_only_its_log(tmp_path: Path) -> None:
    run_dir = claim_run_dir(cfg(tmp_path, "data.datasets.0.path=/nowhere.jsonl"), resume=False)
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rayft.log").write_text("first attempt\n")
    (run_dir / "data").mkdir()
    (run_dir / "tracking.json").write_text("{}")
    for resume in (False, True):  # the corrected command, with or without --resume
        assert claim_run_dir(cfg(tmp_path, "train.learning_rate=1e-3"), resume=resume) == run_dir
        assert "learning_rate: 0.001" in (run_dir / "config.yaml").read_text()
    (run_dir / "notes.txt").write_text("the user's own file")
    assert claim_run_dir(cfg(tmp_path), resume=False) == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "logs", "notes.txt"]
    assert (run_dir / "logs" / "rayft.log").read_text() == "first attempt\n"


def test_resume_accepts_schedule_changes_but_not_model_changes(tmp_path: Path) -> None:
    saved = cfg(tmp_path).model_dump(mode="json")
    check_resumable(saved, cfg(tmp_path, "train.max_steps=500", "scaling.num_workers=4").model_dump(mode="json"))
    with pytest.raises(ConfigError, match=r"train.learning_rate: 0.0002 -> 0.001"):
        check_resumable(saved, cfg(tmp_path, "train.learning_rate=1e-3").model_dump(mode="json"))


def test_resume_accepts_other_deepspeed_settings_and_another_strategy_without_them(tmp_path: Path) -> None:
    offload = "train.deepspeed={zero_optimization: {offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}"
    saved = cfg(tmp_path, "train.strategy=deepspeed", offload).model_dump(mode="json")
    # the same run on GPUs with room to spare: DeepSpeed's offload off, or DDP (which takes no train.deepspeed)
    check_resumable(saved, cfg(tmp_path, "train.strategy=deepspeed").model_dump(mode="json"))
    check_resumable(saved, cfg(tmp_path, "train.strategy=ddp").model_dump(mode="json"))
    check_resumable(cfg(tmp_path).model_dump(mode="json"), saved)  # and from DDP to offloaded ZeRO-3
    with pytest.raises(ConfigError, match=r"train.micro_batch_size: 4 -> 2"):
        check_resumable(saved, cfg(tmp_path, "train.strategy=deepspeed", offload, "train.micro_batch_size=2")
                        .model_dump(mode="json"))  # fmt: skip


def test_unwritable_storage_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match="cannot write .* choose a writable directory"):
        claim_run_dir(load_config(None, [f"storage_path={blocker}", "name=x"]), resume=False)
