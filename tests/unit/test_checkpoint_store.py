"""Checkpoints on storage: the manifest is the commit point, corruption is caught, partials go."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rayft.runs.checkpoints import (
    latest_valid_checkpoint,
    prune_checkpoints,
    publish_checkpoint,
    remove_incomplete,
    scan_checkpoints,
    usable_checkpoint,
)
from rayft.runs.manifest import read_manifest, verify_checkpoint, write_manifest


def make_checkpoint(root: Path, step: int, loss: float | None = None, complete: bool = True) -> Path:
    directory = root / f"step-{step:06d}"
    (directory / "trainer").mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4)
    (directory / "trainer" / "state.json").write_text(f'{{"step": {step}}}')
    if complete:
        write_manifest(directory, step, {"eval/loss": loss} if loss is not None else {})
    return directory


def test_manifest_lists_every_file_and_verifies(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path, 5, loss=1.5)
    manifest = read_manifest(directory)
    assert manifest is not None
    assert set(manifest.files) == {"adapter_model.safetensors", "trainer/state.json"}
    assert manifest.step == 5 and manifest.metrics == {"eval/loss": 1.5}
    assert verify_checkpoint(directory) == []


def test_corruption_truncation_and_loss_are_each_detected(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path, 1)
    weights = directory / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert verify_checkpoint(directory) == [f"{weights}: sha256 differs from the manifest (corrupted)"]
    weights.write_bytes(bytes(data[:100]))
    assert "size 100 differs from the manifest's 1024" in verify_checkpoint(directory)[0]
    weights.unlink()
    assert verify_checkpoint(directory) == [f"{weights}: listed in the manifest but missing"]
    incomplete = make_checkpoint(tmp_path, 2, complete=False)
    assert "no valid rayft_checkpoint.json" in verify_checkpoint(incomplete)[0]


def test_latest_valid_skips_a_corrupted_checkpoint_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_checkpoint(tmp_path, 2)
    bad = make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 6, complete=False)
    (bad / "trainer" / "state.json").write_text('{"step": 9}')
    with caplog.at_level(logging.WARNING):
        chosen = latest_valid_checkpoint(tmp_path)
    assert chosen == tmp_path / "step-000002"
    assert "Skipping checkpoint" in caplog.text and "step-000004" in caplog.text
    assert usable_checkpoint(bad, tmp_path) == tmp_path / "step-000002"
    assert usable_checkpoint(None, tmp_path) == tmp_path / "step-000002"


def test_incomplete_and_staging_directories_are_removed(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4, complete=False)
    (tmp_path / ".step-000006.partial-123").mkdir()
    removed = remove_incomplete(tmp_path)
    assert sorted(p.name for p in removed) == [".step-000006.partial-123", "step-000004"]
    assert [c.name for c in scan_checkpoints(tmp_path)] == ["step-000002"]


def test_publish_replaces_atomically_and_prune_follows_the_plan(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step, loss in ((2, 3.0), (4, 1.0), (6, 2.0)):
        source = make_checkpoint(tmp_path / "scratch", step, loss)
        publish_checkpoint(source, root / source.name)
        assert not source.exists()
    again = make_checkpoint(tmp_path / "scratch2", 6, 2.0)
    publish_checkpoint(again, root / "step-000006")
    assert verify_checkpoint(root / "step-000006") == []
    pruned = prune_checkpoints(root, num_to_keep=1)
    assert [p.name for p in pruned] == ["step-000002"]
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000006"]
