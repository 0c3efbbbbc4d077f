"""Training runs in tests: configs of the tiny model, the training loop run on prepared units, a crashed
run made from a finished one, and what a run wrote (metrics, adapter tensors)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig, load_config
from rayft.data.prepared import PreparedData
from tests.support.faults import fault_callbacks

# 64 units, 2 workers x 4 per micro-batch: 8 steps per epoch, so 12 steps cross an epoch boundary; a
# checkpoint every 3 steps; LoRA dropout on, so that a resume must restore the RNG states too.
RESUME_RUN = ("train.max_steps=12", "train.save_steps=3", "train.eval_steps=null", "lora.dropout=0.1")


def tiny_config(model_dir: Path, storage: Path, *overrides: str) -> RayftConfig:
    """A config for the tiny model: 2 workers, small LoRA, frequent saves."""
    base = [
        f"model.name={model_dir}",
        f"storage_path={storage}",
        "name=run",
        "scaling.num_workers=2",
        "train.micro_batch_size=4",
        "train.learning_rate=3e-3",
        "train.save_steps=2",
        "train.eval_steps=2",
        "lora.r=4",
        "logging.tensorboard=false",
    ]
    # The faults a test set in its environment ride in the config: the shared Ray's workers do not see it.
    faults = fault_callbacks(os.environ)
    if faults and not any(o.startswith("train.callbacks") for o in overrides):
        base.append(f"train.callbacks={json.dumps(faults)}")
    return load_config(None, [*base, *overrides])


def train_on(cfg: RayftConfig, prepared: PreparedData, *, resume: bool = False) -> Path:
    """Claim the run and launch its workers (as the training driver does) on already prepared units;
    return the run directory."""
    from rayft.runs.location import RunLocation
    from rayft.training.driver.run import default_launcher
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    run_dir = claim_run_dir(cfg, resume=resume)
    default_launcher(cfg).launch(build_worker_plan(cfg, prepared, RunLocation(run_dir)), prepared)
    return run_dir


def interleaved(prepared: PreparedData, root: Path, per_rank: int = 4) -> PreparedData:
    """The same units ordered so that one worker with two micro-batches a step trains, in every step,
    the micro-batches the two workers of ``prepared`` train (rank 0's, then rank 1's), ``per_rank``
    units each (unshuffled data: each rank reads its half in storage order)."""
    from dataclasses import replace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rayft.testing.units import write_split

    units = pa.concat_tables(pq.read_table(f) for f in prepared.train.files).to_pylist()
    half = len(units) // 2
    ordered = [
        u
        for step in range(0, half, per_rank)
        for u in (*units[step : step + per_rank], *units[half + step : half + step + per_rank])
    ]
    return replace(prepared, root=str(root), train=write_split(root / "train", ordered))


def crashed_copy(finished: Path, storage: Path, *, crashed_at: int) -> Path:
    """The state a run leaves when it dies before step ``crashed_at``, made from a finished run
    instead of training again: a copy of ``finished`` as ``storage/run`` without final/, without
    the checkpoints of ``crashed_at`` and later, and with the metrics of the steps before it.

    Exact for a deterministic run: the checkpoints it keeps are the ones the crashed run would have
    committed. The copy's config names ``storage`` (what the run's own config would say). Ray
    Train's own record of the checkpoints is left out (it would name the removed ones), so a resume
    finds its checkpoint by scanning the directory, as after a move to another machine; runs that
    really crash (``RAYFT_FAULT_RAISE``) resume through Ray's record."""
    import shutil

    from rayft.runs.checkpoints import scan_checkpoints

    run_dir = storage / "run"
    shutil.copytree(finished, run_dir, symlinks=True)
    shutil.rmtree(run_dir / "final")
    (run_dir / "checkpoints" / "checkpoint_manager_snapshot.json").unlink(missing_ok=True)
    for checkpoint in scan_checkpoints(run_dir / "checkpoints"):
        if checkpoint.step >= crashed_at:
            shutil.rmtree(run_dir / "checkpoints" / checkpoint.name)
    kept = [json.dumps(r) + "\n" for r in read_metrics(run_dir) if r["step"] < crashed_at]
    (run_dir / "metrics.jsonl").write_text("".join(kept))
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(str(finished.parent), str(storage)))
    return run_dir


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir: Path) -> dict[int, float]:
    """Training loss by step."""
    return {r["step"]: r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r}


def resumed_after(run_dir: Path, interrupted_at: float, last_step: int) -> int:
    """The step a resumed run restarted from, read from metrics.jsonl, which keeps the records up to
    the restored step (written before the interruption, at ``time.time()`` ``interrupted_at``) and
    appends those of the steps after it, up to ``last_step``, each once.

    What the file holds is the evidence: the worker's "resumed from" log line reaches the driver
    through Ray's log relay, which may deliver it after the command has returned."""
    records = [r for r in read_metrics(run_dir) if "train/loss" in r]
    before = [r["step"] for r in records if r["time"] < interrupted_at]
    after = [r["step"] for r in records if r["time"] >= interrupted_at]
    assert before == list(range(1, len(before) + 1)), records
    assert after == list(range(len(before) + 1, last_step + 1)), records
    return len(before)


def adapter_tensors(directory: Path) -> dict[str, Any]:
    """The tensors of an adapter_model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))
