"""Corrupted checkpoints, in-process training (no Ray): a shard whose bytes changed is detected by
checksum and the previous checkpoint is used, with a warning naming the bad file; when no
checkpoint verifies, the run stops with an error instead of restarting from step 0.

The crashed runs are copies of one finished run cut back to step 6 (what a run that dies before
step 7 leaves: tests.support.runs.crashed_copy); the chaos tier kills runs for real."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.errors import CheckpointError
from tests.support.runs import crashed_copy, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

LOCAL = ("scaling.num_workers=0", "train.max_steps=8", "train.save_steps=2", "train.eval_steps=null",
         "checkpoint.num_to_keep=null")  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=32)


@pytest.fixture(scope="module")
def finished(tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run trained to its end without a fault: the reference, and the source of the crashed runs."""
    return train_on(tiny_config(tiny_model_dir, tmp_path_factory.mktemp("finished"), *LOCAL), prepared)


def crashed_before_step_7(finished: Path, storage: Path) -> Path:
    """The run as a failure before step 7 leaves it (checkpoints 2, 4 and 6 committed); its checkpoints."""
    crashed_copy(finished, storage, crashed_at=7)
    root = storage / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000004", "step-000006"]
    return root


def flip_bytes(path: Path) -> None:
    """Change bytes in the middle of a file without changing its size."""
    assert not path.is_symlink(), path  # a copy's own file, not the finished run's
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


def test_a_corrupted_shard_falls_back_to_the_previous_checkpoint_with_a_warning(
    finished: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = train_losses(finished)
    root = crashed_before_step_7(finished, tmp_path / "bad")
    bad = root / "step-000006" / "adapter_model.safetensors"
    flip_bytes(bad)

    caplog.set_level(logging.INFO, logger="rayft")
    train_on(tiny_config(tiny_model_dir, tmp_path / "bad", *LOCAL), prepared, resume=True)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(bad) in w and "sha256 differs" in w for w in warnings), warnings
    assert f"resumed from {root / 'step-000004'} at step 4" in caplog.text
    assert train_losses(tmp_path / "bad" / "run") == reference  # steps 5-8 recomputed exactly


def test_no_silent_restart_from_step_0_when_every_checkpoint_is_corrupted(
    finished: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    root = crashed_before_step_7(finished, tmp_path)
    for checkpoint in root.iterdir():
        flip_bytes(checkpoint / "trainer" / "optimizer.pt")

    with pytest.raises(CheckpointError, match=r"no usable checkpoint to resume from: .*step-000006.*delete"):
        train_on(tiny_config(tiny_model_dir, tmp_path, *LOCAL), prepared, resume=True)
    assert not (tmp_path / "run" / "final").exists()
