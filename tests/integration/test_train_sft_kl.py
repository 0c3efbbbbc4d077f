"""SFT with a KL penalty to the base model on Ray Train: 2 workers (DDP) equal 1 worker with the same
micro-batches in every step, figures included, and a resume from a checkpoint is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.support.runs import crashed_copy, interleaved, read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration

# No shuffle: each rank reads its half in storage order, so the one-worker copy holds the same rows every step.
SFT_KL = ("train.objective=sft_kl", "train.sft_kl.beta=0.5", "data.datasets=[{path: 'builtin:arithmetic', "
          "max_rows: 48}]", "data.validation_fraction=0", "data.shuffle_buffer_size=1", "lora.dropout=0",
          "train.max_steps=4", "train.save_steps=2", "train.eval_steps=null", "train.logging_steps=1",
          "train.learning_rate=2e-2")  # fmt: skip


def kl_config(tiny_model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    return tiny_config(tiny_model_dir, storage, f"data.cache_dir={storage.parent / 'cache'}", *SFT_KL, *overrides)


@pytest.fixture(scope="module")
def prepared(ray_session: None, tiny_model_dir: Path, tmp_path_factory: Any) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(kl_config(tiny_model_dir, tmp_path_factory.mktemp("prep")), None, use_ray=True)


@pytest.fixture(scope="module")
def ddp_run(ray_session: None, tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: Any) -> Path:
    return train_on(kl_config(tiny_model_dir, tmp_path_factory.mktemp("ddp")), prepared)


def figures(run_dir: Path) -> dict[int, dict[str, float]]:
    return {
        r["step"]: {k: r[k] for k in ("sft_kl/nll", "sft_kl/kl")} for r in read_metrics(run_dir) if "train/loss" in r
    }


def test_sft_kl_on_two_workers_equals_one_worker(
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    one = kl_config(tiny_model_dir, tmp_path, "scaling.num_workers=0", "train.gradient_accumulation_steps=2")
    single = train_on(one, interleaved(prepared, tmp_path / "units"))

    want, got = train_losses(ddp_run), train_losses(single)
    assert list(want) == [1, 2, 3, 4] and want.keys() == got.keys()
    # The same sums in another order (one all-reduce against one process's two micro-batches): float32 rounding.
    assert all(got[step] == pytest.approx(want[step], rel=1e-5) for step in want), (got, want)
    assert figures(ddp_run)[1]["sft_kl/kl"] == 0.0 and figures(ddp_run)[4]["sft_kl/kl"] > 0.0
    for step, values in figures(single).items():
        assert values == pytest.approx(figures(ddp_run)[step], rel=1e-4, abs=1e-7), step


def test_sft_kl_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    ddp_run: Path, tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    crashed_copy(ddp_run, tmp_path, crashed_at=3)  # dies in step 3: resumes from the checkpoint of step 2
    resumed = train_on(kl_config(tiny_model_dir, tmp_path), prepared, resume=True)
    assert train_losses(resumed) == train_losses(ddp_run)  # bitwise, every step
    assert figures(resumed) == figures(ddp_run)
