"""Preference training end to end on a tiny random model: pairs prepared on Ray Data, DPO on 2 Ray
Train workers (DDP) equal to 1 worker and to FSDP, an exact resume, the figures TRL logs, and full
fine-tuning DPO on reference log-probabilities stored by a Ray Data pass.

The pairs are separable (every chosen answer ends with '!', every rejected one with '?'), so a few
steps make chosen out-reward rejected on every pair."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.data.prepared import PreparedData
from tests.support.runs import (
    adapter_tensors,
    crashed_copy,
    interleaved,
    read_metrics,
    tiny_config,
    train_losses,
    train_on,
)

pytestmark = pytest.mark.integration

FIGURES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")  # fmt: skip
# 64 pairs, 2 workers x 4 pairs per micro-batch: 8 pairs a step. No shuffle: each rank reads its half in
# storage order, so the one-worker copy below can hold the same pairs in every step.
DPO = ("train.objective=dpo", "train.max_steps=6", "train.save_steps=3", "train.eval_steps=null",
       "train.logging_steps=1", "train.learning_rate=1e-2", "data.shuffle_buffer_size=1")  # fmt: skip


def write_pairs(path: Path, count: int) -> Path:
    """``count`` separable pairs: a sum as the prompt, the answer with '!' chosen, with '?' rejected."""
    rows = [{"prompt": f"Question: {i} + {i % 7}\nAnswer: ", "chosen": f"{2 * i % 97}!", "rejected": f"{2 * i % 97}?"}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def pair_config(tiny_model_dir: Path, storage: Path, pairs: Path, *overrides: str) -> RayftConfig:
    # No LoRA dropout: its random streams differ per rank, and one worker must draw what two do.
    data = (f"data.datasets=[{{path: {pairs}}}]", "data.validation_fraction=0", "lora.dropout=0",
            f"data.cache_dir={pairs.parent / 'cache'}")  # fmt: skip
    return tiny_config(tiny_model_dir, storage, *data, *DPO, *overrides)


def prepare_pairs(cfg: RayftConfig) -> PreparedData:
    from rayft.training.driver.startup import prepare_training_data

    return prepare_training_data(cfg, None, use_ray=True)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", 64)


@pytest.fixture(scope="module")
def prepared(ray_session: None, tiny_model_dir: Path, pairs_file: Path, tmp_path_factory: Any) -> PreparedData:
    return prepare_pairs(pair_config(tiny_model_dir, tmp_path_factory.mktemp("prep"), pairs_file))


@pytest.fixture(scope="module")
def ddp_run(
    ray_session: None, tiny_model_dir: Path, pairs_file: Path, prepared: PreparedData, tmp_path_factory: Any
) -> Path:
    return train_on(pair_config(tiny_model_dir, tmp_path_factory.mktemp("ddp"), pairs_file), prepared)


def figures(run_dir: Path) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: r[k] for k in FIGURES} for r in read_metrics(run_dir) if "train/loss" in r}


def test_dpo_pairs_are_prepared_on_ray_data_with_bad_rows_reported(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pairs = write_pairs(tmp_path / "pairs.jsonl", 12)
    with pairs.open("a") as file:
        bad = ({"prompt": "p", "chosen": "same", "rejected": "same"}, {"prompt": "p", "chosen": " ", "rejected": "b"},
               {"prompt": "p", "chosen": "a"})  # fmt: skip
        file.writelines(json.dumps(row) + "\n" for row in bad)
    cfg = pair_config(tiny_model_dir, tmp_path, pairs, "data.max_rejected_fraction=0.5")
    from rayft.data.preference import pair_preparation
    from rayft.data.prepare import prepare_data

    prepared = prepare_data(cfg.data, cfg.model, cfg.seed, report_dir=tmp_path / "report", use_ray=True,
                            pairs=pair_preparation(True, 256))  # fmt: skip
    assert prepared.pairs and prepared.train.num_examples == 12
    rejected = [json.loads(line) for line in (tmp_path / "report" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["line"], r["reason"]) for r in rejected) == [
        (13, "identical_responses"),
        (14, "empty_field"),
        (15, "missing_field"),
    ]
    assert all(r["file"] == str(pairs) for r in rejected)


def test_dpo_on_two_workers_equals_one_worker_starts_at_ln2_and_separates_the_pairs(
    ddp_run: Path, tiny_model_dir: Path, pairs_file: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    one = pair_config(tiny_model_dir, tmp_path, pairs_file, "scaling.num_workers=0",
                      "train.gradient_accumulation_steps=2")  # fmt: skip
    single = train_on(one, interleaved(prepared, tmp_path / "units"))

    want, got = train_losses(ddp_run), train_losses(single)
    assert list(want) == list(range(1, 7)) and want.keys() == got.keys()
    assert all(got[step] == pytest.approx(want[step], rel=1e-5) for step in want), (got, want)
    first = figures(ddp_run)[1]
    assert want[1] == pytest.approx(math.log(2), abs=1e-6)  # the adapter starts at zero: policy = reference
    assert first["rewards/margins"] == 0.0 and first["rewards/accuracies"] == 0.0
    assert figures(ddp_run)[6]["rewards/accuracies"] > 0.9 and figures(ddp_run)[6]["rewards/margins"] > 0
    for step, values in figures(single).items():
        assert values == pytest.approx(figures(ddp_run)[step], rel=1e-4, abs=1e-6), step


# DeepSpeed ZeRO-3 costs a DeepSpeed engine start on each worker: the slow tier runs it.
@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("deepspeed", marks=pytest.mark.slow)])
def test_dpo_under_zero3_sharding_equals_ddp(
    ddp_run: Path, prepared: PreparedData, tmp_path: Path, *, strategy: str, tiny_model_dir: Path, pairs_file: Path
) -> None:
    pytest.importorskip(strategy if strategy == "deepspeed" else "torch")
    sharded = train_on(pair_config(tiny_model_dir, tmp_path, pairs_file, f"train.strategy={strategy}"), prepared)
    want, got = train_losses(ddp_run), train_losses(sharded)
    assert want.keys() == got.keys()
    assert all(got[step] == pytest.approx(want[step], rel=1e-4) for step in want), (got, want)
    for step, values in figures(sharded).items():
        assert values == pytest.approx(figures(ddp_run)[step], rel=1e-3, abs=1e-5), step
    want_weights, got_weights = adapter_tensors(ddp_run / "final"), adapter_tensors(sharded / "final")
    assert all((got_weights[name] - tensor).abs().max() < 1e-5 for name, tensor in want_weights.items())


def test_dpo_resumes_exactly_after_a_crash(
    ddp_run: Path, tiny_model_dir: Path, pairs_file: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    crashed_copy(ddp_run, tmp_path, crashed_at=5)  # dies in step 5: resumes from the checkpoint of step 3
    resumed = train_on(pair_config(tiny_model_dir, tmp_path, pairs_file), prepared, resume=True)
    assert train_losses(resumed) == train_losses(ddp_run)  # bitwise, every step
    assert figures(resumed) == figures(ddp_run)
    want = adapter_tensors(ddp_run / "final")
    assert all(adapter_tensors(resumed / "final")[name].equal(t) for name, t in want.items())


def test_full_dpo_trains_on_reference_logps_stored_by_a_ray_data_pass(
    ray_session: None, tiny_model_dir: Path, pairs_file: Path, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    # The pass runs on Ray Data; the training, in this process (the Ray Train path is the tests' above).
    cfg = pair_config(tiny_model_dir, tmp_path, pairs_file, "train.method=full", "train.max_steps=1",
                      "train.learning_rate=1e-4", "train.save_steps=1", "scaling.num_workers=0")  # fmt: skip
    prepared = prepare_pairs(cfg)
    assert all("/reference-" in f for f in prepared.train.files)
    stored = pq.read_table(prepared.train.files[0]).column("ref_chosen_logps").to_pylist()
    assert len(stored) == prepared.train.num_units and all(v < 0 for v in stored)
    assert prepare_pairs(cfg).train.files == prepared.train.files  # the second preparation reuses the pass
    run_dir = train_on(cfg, prepared)
    assert train_losses(run_dir)[1] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(figures(run_dir)[1]["rewards/margins"]) < 1e-5
    assert (run_dir / "final" / "model.safetensors").is_file()
