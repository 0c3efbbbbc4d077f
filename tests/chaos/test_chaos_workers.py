"""SIGKILL a Ray Train worker at a random step (2 workers, gloo, tiny model): every run completes,
the per-step losses equal an uninterrupted run bitwise, at most ``save_steps`` steps are
recomputed, and every training sample of an epoch is consumed exactly once (sample ids logged per
step through RAYFT_SAMPLE_LOG).
Trials cycle through gradient accumulation, packing and plain batches. RAYFT_CHAOS_TRIALS=full runs
10 trials (CI: 1, with gradient accumulation, the one bitwise worker-kill check of DDP in the default
tiers; the plain case is in the slow tier, tests/integration/test_train.py)."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from tests.chaos.conftest import chaos_seed, chaos_trials
from tests.support.kills import kill_a_worker_at
from tests.support.runs import adapter_tensors, tiny_config, train_losses, train_on

pytestmark = pytest.mark.chaos

SAVE_STEPS = 3
# 64 units, 2 workers x 4 units per step: 8 steps per epoch; 12 steps cross an epoch boundary.
# Synchronous saves: a kill can then never fall between a save's snapshot and its commit, which
# would add the steps of that in-flight save to the recomputed ones (see docs/reliability.md).
COMMON = ("train.max_steps=12", f"train.save_steps={SAVE_STEPS}", "train.eval_steps=null",
          "checkpoint.async_upload=false")  # fmt: skip
MODES = {
    "accumulation": ("train.micro_batch_size=2", "train.gradient_accumulation_steps=2"),
    "packing": ("train.micro_batch_size=2",),  # units of 2-3 examples packed into 512 tokens
    "plain": ("train.micro_batch_size=4",),
}


@pytest.fixture(scope="module")
def packed(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    """The 64 training examples packed first-fit into units of at most 512 tokens (an even number
    of units, so that both workers get every unit)."""
    from rayft.config import ModelConfig
    from rayft.data.builtin.arithmetic import iter_arithmetic_problems
    from rayft.data.packing import build_units, plan_packs
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import qa_unit, write_prepared

    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    rows = list(iter_arithmetic_problems(64, seed=0))
    examples = [{**qa_unit(tokenizer, r["question"], r["answer"], i), "sample_id": i} for i, r in enumerate(rows)]
    packs = plan_packs([len(e["input_ids"]) for e in examples], 512)
    units = build_units(examples, packs[: len(packs) // 2 * 2])
    return write_prepared(tmp_path_factory.mktemp("packed"), units, max_seq_length=512)


def epoch_of(prepared: PreparedData, settings: tuple[str, ...]) -> tuple[list[int], int]:
    """The sample ids of every training unit, and the optimizer steps of one epoch."""
    import pyarrow.parquet as pq

    from rayft.training.loop.plan import plan_schedule

    train = tiny_config(Path("m"), Path("s"), *settings).train
    schedule = plan_schedule(prepared.train.num_units, 2, train.micro_batch_size,
                             train.gradient_accumulation_steps, 1, None)  # fmt: skip
    assert schedule.dropped_units == 0
    ids = [i for path in prepared.train.files for unit in pq.read_table(path).column("sample_ids").to_pylist()
           for i in unit]  # fmt: skip
    return sorted(ids), schedule.steps_per_epoch


def read_sample_log(path: Path) -> dict[tuple[int, int], list[list[int]]]:
    """Every record of the sample log, grouped by (step, rank), in the order written."""
    records: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        records[(record["step"], record["rank"])].append(record["sample_ids"])
    return records


def test_killing_a_worker_at_a_random_step_costs_at_most_save_steps_and_no_sample(
    ray_session: None, tiny_model_dir: Path, request: pytest.FixtureRequest, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    rng = random.Random(chaos_seed())
    references: dict[str, Path] = {}
    for trial in range(chaos_trials(ci=1, full=10)):
        mode = list(MODES)[trial % len(MODES)]
        settings = (*COMMON, *MODES[mode])
        prepared: PreparedData = request.getfixturevalue("packed" if mode == "packing" else "prepared")
        samples, steps_per_epoch = epoch_of(prepared, settings)
        if mode not in references:
            monkeypatch.delenv("RAYFT_SAMPLE_LOG", raising=False)
            monkeypatch.delenv("RAYFT_FAULT_HOLD", raising=False)
            references[mode] = train_on(tiny_config(tiny_model_dir, tmp_path / f"ref-{mode}", *settings), prepared)
        kill_step = rng.randint(2, 11)
        what = f"trial {trial} (seed {chaos_seed()}, {mode}): kill after step {kill_step}"
        storage = tmp_path / f"trial-{trial}"
        sample_log = tmp_path / f"samples-{trial}.jsonl"
        monkeypatch.setenv("RAYFT_SAMPLE_LOG", str(sample_log))
        killed: list[int] = []
        watcher = kill_a_worker_at(storage / "run", kill_step, killed, monkeypatch, choose=random.choice)
        run_dir = train_on(tiny_config(tiny_model_dir, storage, *settings), prepared)
        watcher.join(timeout=5)

        assert killed and killed[0] < 12, f"{what}: no worker was killed during training ({killed})"
        assert train_losses(run_dir) == train_losses(references[mode]), what  # bitwise, every step
        reference_weights, weights = adapter_tensors(references[mode] / "final"), adapter_tensors(run_dir / "final")
        assert all(weights[name].equal(tensor) for name, tensor in reference_weights.items()), what

        records = read_sample_log(sample_log)
        assert sorted({step for step, _ in records}) == list(range(1, 13)), what
        recomputed = sorted({step for (step, _), runs in records.items() if len(runs) > 1})
        assert len(recomputed) <= SAVE_STEPS, f"{what}: recomputed steps {recomputed}"
        assert all(all(r == runs[0] for r in runs) for runs in records.values()), f"{what}: a step changed data"
        assert steps_per_epoch < 12, f"{what}: the run must cross an epoch boundary"
        epoch = [i for (step, _), runs in records.items() if step <= steps_per_epoch for i in runs[-1]]
        assert sorted(epoch) == samples, f"{what}: an epoch did not consume every sample exactly once"
