"""Writing and reading a worker's checkpoint: model files, optimizer, scheduler, trainer state,
RNG states of every rank, and the manifest written last.

Rank 0 writes everything but the other ranks' RNG files; each rank reports its own directory
and Ray merges them on storage. The manifest lists every rank's files, so a checkpoint missing
any of them fails verification.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.training import layout
from rayft.training.manifest import describe_files, write_manifest
from rayft.training.model import unwrap
from rayft.training.session import all_gather_objects, scratch_dir

if TYPE_CHECKING:
    from rayft.training.worker import Worker, WorkerPlan

log = logging.getLogger("rayft.train")


@dataclass
class TrainerState:
    """Loop state that survives a restart (saved as trainer/state.json)."""

    step: int = 0
    last_train_loss: float | None = None
    last_eval_loss: float | None = None
    best_eval_loss: float | None = None
    evals_without_improvement: int = 0
    stopped_early: bool = False
    real_tokens: int = 0
    computed_tokens: int = 0
    checkpoint_blocked_s: float = 0.0

    def record_eval(self, loss: float, patience: int | None) -> None:
        """Track the best validation loss and decide early stopping."""
        self.last_eval_loss = loss
        if self.best_eval_loss is None or loss < self.best_eval_loss:
            self.best_eval_loss = loss
            self.evals_without_improvement = 0
        else:
            self.evals_without_improvement += 1
        self.stopped_early = patience is not None and self.evals_without_improvement >= patience

    def metrics(self) -> dict[str, float]:
        """The figures attached to a checkpoint (and used to rank checkpoints)."""
        values = {"step": float(self.step), "train/loss": self.last_train_loss, "eval/loss": self.last_eval_loss}
        return {k: float(v) for k, v in values.items() if v is not None}


def save_checkpoint(worker: Worker) -> None:
    """Write this rank's part of the checkpoint for the current step and report it."""
    started = time.monotonic()
    session, state = worker.session, worker.state
    directory = scratch_dir(f"rayft-{layout.step_dir_name(state.step)}-rank{session.rank}-")
    if session.rank == 0:
        write_model_files(worker.model, worker.tokenizer, worker.plan, directory)
        write_trainer_files(worker, directory / layout.TRAINER_SUBDIR)
    write_rng_state(directory / layout.TRAINER_SUBDIR / layout.rng_file(session.rank))
    others = all_gather_objects({} if session.rank == 0 else describe_files(directory))
    if session.rank == 0:
        extra = {name: entry for files in others for name, entry in files.items()}
        write_manifest(directory, state.step, state.metrics(), checkpoint_info(worker.plan), extra)
    session.report_checkpoint(state.metrics(), directory, state.step, async_upload=worker.plan.checkpoint.async_upload)
    state.checkpoint_blocked_s += time.monotonic() - started


def checkpoint_info(plan: WorkerPlan) -> dict[str, Any]:
    """Lineage recorded in every manifest (the driver puts world size and data key in lineage)."""
    return {"method": plan.train.method, "base_model": plan.model.name, **plan.lineage}


def write_model_files(model: Any, tokenizer: Any, plan: WorkerPlan, directory: Path) -> None:
    """Weights (adapter or full) as safetensors, tokenizer with chat template, generation config
    whose EOS ids include the end-of-turn token, and the resolved config."""
    inner = unwrap(model)
    directory.mkdir(parents=True, exist_ok=True)
    inner.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    generation = _generation_config(inner, tokenizer)
    generation.save_pretrained(directory)
    (directory / layout.CHECKPOINT_CONFIG_FILE).write_text(plan.resolved_config, encoding="utf-8")


def _generation_config(model: Any, tokenizer: Any) -> Any:
    import copy

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    generation = copy.deepcopy(base.generation_config)
    eos = generation.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    generation.eos_token_id = sorted(eos_ids) if len(eos_ids) > 1 else next(iter(eos_ids), None)
    generation.pad_token_id = tokenizer.pad_token_id
    return generation


def write_trainer_files(worker: Worker, directory: Path) -> None:
    """Optimizer, scheduler, loss scaler and loop state."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    torch.save(worker.optimizer.state_dict(), directory / layout.OPTIMIZER_FILE)
    (directory / layout.SCHEDULER_FILE).write_text(json.dumps(worker.scheduler.state_dict()))
    (directory / layout.STATE_FILE).write_text(json.dumps(asdict(worker.state), indent=2))
    if worker.scaler is not None:
        torch.save(worker.scaler.state_dict(), directory / "scaler.pt")


def write_rng_state(path: Path) -> None:
    """This rank's torch (CPU and CUDA) and Python RNG states."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(state, path)


def restore_training_state(directory: Path, optimizer: Any, scheduler: Any, rank: int) -> TrainerState:
    """Load optimizer, scheduler, loop state and this rank's RNG from a checkpoint directory.

    Only tensors and plain Python values are unpickled (``weights_only=True``).
    """
    import torch

    trainer = directory / layout.TRAINER_SUBDIR
    optimizer.load_state_dict(torch.load(trainer / layout.OPTIMIZER_FILE, weights_only=True, map_location="cpu"))
    scheduler.load_state_dict(json.loads((trainer / layout.SCHEDULER_FILE).read_text()))
    state = TrainerState(**json.loads((trainer / layout.STATE_FILE).read_text()))
    rng_path = trainer / layout.rng_file(rank)
    if rng_path.is_file():
        rng = torch.load(rng_path, weights_only=True)
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_random_state(rng["python"]))
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    else:
        log.warning("%s has no RNG state for rank %d (the worker count changed); dropout restarts", directory, rank)
    return state


def _as_random_state(value: Any) -> tuple[Any, ...]:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def save_final(model: Any, tokenizer: Any, plan: WorkerPlan, state: TrainerState) -> Path:
    """Write ``final/`` (model files, config, manifest) atomically into the run directory."""
    run_dir = Path(plan.run_dir)
    target = run_dir / layout.FINAL_DIR
    staging = run_dir / f".{layout.FINAL_DIR}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    write_model_files(model, tokenizer, plan, staging)
    write_manifest(staging, state.step, state.metrics(), checkpoint_info(plan) | {"final": True})
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    log.info("wrote %s (step %d)", target, state.step)
    return target
