"""SIGKILL in the middle of a checkpoint save, at a random step and a random point of the save,
with synchronous and asynchronous writing: the next start resumes from the latest complete
checkpoint (never a partial one), removes the partial directory, and ends with the losses of an
uninterrupted run. RAYFT_CHAOS_TRIALS=full runs 20 trials (CI: 3)."""

from __future__ import annotations

import logging
import random
import signal
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.runs.layout import step_dir_name
from rayft.runs.manifest import verify_checkpoint
from rayft.training.loop.callbacks import SAVE_STAGES
from tests.chaos.conftest import chaos_seed, chaos_trials, run_driver
from tests.support.runs import tiny_config, train_losses, train_on

pytestmark = pytest.mark.chaos

# In-process training (no Ray): 64 units, 1 worker x 4 per step = 16 steps per epoch.
LOCAL = ("scaling.num_workers=0", "train.max_steps=8", "train.save_steps=2", "train.eval_steps=null",
         "checkpoint.num_to_keep=null")  # fmt: skip


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train_losses(train_on(tiny_config(tiny_model_dir, tmp_path_factory.mktemp("ref"), *LOCAL), prepared))


def test_sigkill_during_a_save_resumes_from_the_latest_complete_checkpoint(
    tiny_model_dir: Path, prepared: PreparedData, reference: dict, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rayft.train")
    rng = random.Random(chaos_seed())
    for trial in range(chaos_trials(ci=3, full=20)):
        step, point, background = rng.choice([2, 4, 6]), rng.choice(SAVE_STAGES), rng.choice(["true", "false"])
        what = f"trial {trial} (seed {chaos_seed()}): kill at {point} of step {step}, async={background}"
        storage = tmp_path / f"trial-{trial}"
        settings = (*LOCAL, f"checkpoint.async_upload={background}")

        killed = run_driver(prepared, tiny_model_dir, storage, *settings,
                            env={"RAYFT_FAULT_KILL_IN_SAVE": f"{step}:{point}"})  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, f"{what}\n{killed.stderr[-3000:]}"
        root = storage / "run" / "checkpoints"
        partial = list(root.glob(f".{step_dir_name(step)}.partial-*"))
        assert partial, f"{what}: no partial directory, so the kill was not inside the save"
        assert not (root / step_dir_name(step)).exists(), what
        committed = sorted(p.name for p in root.glob("step-*"))
        assert committed == [step_dir_name(s) for s in range(2, step, 2)], what
        assert all(verify_checkpoint(root / name) == [] for name in committed), what

        caplog.clear()
        train_on(tiny_config(tiny_model_dir, storage, *settings), prepared, resume=True)  # the next start
        if step > 2:
            assert f"resumed from {root / step_dir_name(step - 2)} at step {step - 2}" in caplog.text, what
        else:
            assert "resumed from" not in caplog.text, what
        assert not any(p.exists() for p in partial), f"{what}: the partial directory was not removed"
        assert not list(root.glob(".*")), what
        assert train_losses(storage / "run") == reference, what  # bitwise, every step
        assert verify_checkpoint(storage / "run" / "final") == [], what
