"""A checkpoint whose commit marker (its manifest) exists is never deleted by rayft: one whose marker
cannot be read is set aside under a name of its own, named in one warning, and a resume falls back to
the newest good checkpoint before it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rayft.runs.checkpoints import prune_checkpoints, remove_incomplete, resume_checkpoint, scan_checkpoints
from rayft.runs.layout import MANIFEST_FILE
from rayft.runs.manifest import write_manifest
from rayft.runs.planner import StartPlan
from rayft.runs.selection import CheckpointInfo, plan_cleanup, plan_retention
from rayft.runs.store import LocalRunStore


def make_checkpoint(root: Path, step: int, *, marker: str | None = None) -> Path:
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(bytes(range(64)))
    write_manifest(directory, step)
    if marker is not None:
        (directory / MANIFEST_FILE).write_text(marker, encoding="utf-8")
    return directory


def test_the_planners_never_delete_a_checkpoint_whose_marker_exists() -> None:
    infos = [
        CheckpointInfo("step-000005", 5, True),
        CheckpointInfo("step-000010", 10, False, unreadable=True),
        CheckpointInfo("step-000015", 15, False),  # no marker: its save did not finish
    ]
    plan = plan_cleanup(infos)
    assert [c.name for c in plan.remove] == ["step-000015"]
    assert [c.name for c in plan.set_aside] == ["step-000010"]
    for keep in (None, 1):
        assert "step-000010" not in {c.name for c in plan_retention(infos, keep)}


@pytest.mark.parametrize("garbage", ["{garbage", "", '{"format": "other"}', '{"format": "rayft-checkpoint/1"}'])
def test_an_unreadable_marker_is_set_aside_and_the_resume_falls_back(
    tmp_path: Path, garbage: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_checkpoint(tmp_path, 5)
    bad = make_checkpoint(tmp_path, 10, marker=garbage)
    bad_files = sorted(p.relative_to(bad) for p in bad.rglob("*"))
    with caplog.at_level(logging.WARNING, logger="rayft.runs.checkpoints"):
        assert remove_incomplete(tmp_path) == []
    aside = tmp_path / "step-000010.unreadable"
    assert not bad.exists() and sorted(p.relative_to(aside) for p in aside.rglob("*")) == bad_files
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "step-000010" in lines[0] and str(aside) in lines[0], lines
    assert "\n" not in lines[0]
    assert resume_checkpoint(None, tmp_path) == good
    assert [c.name for c in scan_checkpoints(tmp_path)] == ["step-000005"]
    assert prune_checkpoints(tmp_path, 1) == [] and aside.is_dir()


def test_a_second_unreadable_copy_of_a_step_gets_a_name_of_its_own(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10, marker="{garbage")
    remove_incomplete(tmp_path)
    make_checkpoint(tmp_path, 10, marker="{garbage")
    remove_incomplete(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000010.unreadable", "step-000010.unreadable-2"]


def test_a_resume_of_the_store_keeps_the_unreadable_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    make_checkpoint(run / "checkpoints", 5)
    make_checkpoint(run / "checkpoints", 10, marker="{garbage")
    LocalRunStore(run).begin(StartPlan("resume", "resuming"), "name: run\n")
    assert (run / "checkpoints" / "step-000010.unreadable" / "model.safetensors").is_file()
    assert [c.step for c in LocalRunStore(run).checkpoints()] == [5]
