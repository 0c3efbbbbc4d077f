"""Writing and reading a worker's checkpoint: model files, optimizer, scheduler, trainer state,
RNG states of every rank, and the manifest written last.

Every rank snapshots its state in memory; rank 0 gathers the other ranks' RNG states and writes
the whole checkpoint into a staging directory beside its final place (``.step-N.partial-PID``),
manifest last, then the session commits it with one rename. A crash at any moment leaves either
the previous checkpoints or a complete new one, never a half-written ``step-N/``.
"""

from __future__ import annotations

import io
import json
import logging
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from rayft.errors import CheckpointError, RayftError
from rayft.export.checks import check_adapter
from rayft.files import replace_dir, share_like_siblings, staging_dir
from rayft.runs import layout
from rayft.runs.checkpoints import full_disk_reported
from rayft.runs.manifest import write_manifest
from rayft.security import redact
from rayft.training.loop.session import TrainSession, all_gather_objects
from rayft.training.modeling.model import base_model, transformers_model, unwrap
from rayft.training.strategies.parallel import check_full_shapes, trainable_names

if TYPE_CHECKING:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerBase

    from rayft.training.modeling.model import TransformersModel
    from rayft.training.strategies.parallel import Parallelism

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
    eval_metrics: dict[str, float] = field(default_factory=dict)  # a task's last figures but the loss (eval/accuracy)

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
        return {k: float(v) for k, v in values.items() if v is not None} | self.eval_metrics


@dataclass
class Snapshot:
    """Copies (on the CPU) of everything a checkpoint holds, taken between two optimizer steps so
    that the files can be written while training goes on."""

    step: int
    metrics: dict[str, float]
    state_json: str
    scheduler_json: str
    rng_files: dict[str, bytes]
    model_state: dict[str, torch.Tensor] | None = None
    optimizer_state: dict[str, Any] | None = None
    scaler_state: dict[str, Any] | None = None


class CheckpointWriter:
    """Writes checkpoints in the foreground, or in one background thread when ``background``.

    At most one save is in flight: the next save (and the end of the run) first waits for the
    previous one, and an error of a background save is raised there.
    """

    def __init__(self, *, background: bool) -> None:
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` (now, or in the background) after the previous one has finished."""
        self.wait()
        if not self.background:
            job()
            return

        def guarded() -> None:
            try:
                job()
            except BaseException as exc:  # re-raised in the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=guarded, name="rayft-checkpoint-writer", daemon=True)
        self._thread.start()

    def drain(self, timeout_s: float) -> None:
        """On the way out of a failed run: let a save in flight commit (it holds a completed step),
        for at most ``timeout_s``; its own error is logged, not raised over the run's error."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("a checkpoint save was still running after %g s and was abandoned", timeout_s)
            self._thread = None
        if self._error is not None:
            log.warning("the checkpoint save in flight failed too: %s", self._error)
            self._error = None

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, RayftError):  # already says what, where and the fix (a full disk)
                raise error
            raise CheckpointError(f"writing a checkpoint failed: {type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class ModelFiles:
    """What a run writes beside the weights of every checkpoint and of ``final/``."""

    method: str  # "lora" (an adapter, checked after writing) or "full"
    lora_r: int  # the adapter rank the written adapter is checked against
    resolved_config: str  # the run's resolved config (secrets are redacted on writing)
    lineage: dict[str, Any] = field(default_factory=dict)  # recorded in every manifest (method, base model, ...)
    # GRPO leaves a fresh adapter at zero until some prompt's group gets rewards that differ: a checkpoint
    # written before then is untrained by right, not emptied by a sharded save.
    untrained_allowed: bool = False


@dataclass(frozen=True)
class TrainingObjects:
    """The live objects a checkpoint copies, and the strategy that gathers them from the ranks."""

    parallel: Parallelism
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None = None  # the fp16 GradScaler, when there is one
    # This rank's state beyond the model's (GRPO's rollouts sampled ahead), as JSON; None: none to keep.
    rank_state: Callable[[], str | None] | None = None


WriteModel: TypeAlias = "Callable[[torch.nn.Module, Path, dict[str, torch.Tensor] | None], None]"
"""Writes the model files of a checkpoint: (model, directory, state dict snapshot or None for the
live weights); :meth:`rayft.training.loop.method.Method.write_model`."""


SaveStageHook = Callable[[int, str], None]
"""Called with (step, stage) at each stage of a save (the loop callbacks' ``on_save_stage``)."""


class Checkpointer:
    """Saves one worker's checkpoints through its session, at most one save in flight
    (in one background thread when ``background``)."""

    def __init__(
        self,
        session: TrainSession,
        files: ModelFiles,
        write_model: WriteModel,
        *,
        background: bool,
        on_stage: SaveStageHook = lambda step, stage: None,
    ) -> None:
        self.session = session
        self.files = files
        self.write_model = write_model
        self.on_stage = on_stage
        self.writer = CheckpointWriter(background=background)

    def save(self, objects: TrainingObjects, state: TrainerState) -> None:
        """Save the current step: snapshot the state in memory here (every rank), then write it to a
        staging directory beside its final place, manifest last, and commit it with one rename.

        In the background the writing and committing happen in the writer's thread, so the loop is
        blocked only for the snapshot (and for a previous save still in flight).
        """
        started = time.monotonic()
        self.writer.wait()
        snapshot = take_snapshot(objects, state, rank=self.session.rank, method=self.files.method)
        session, on_stage, files = self.session, self.on_stage, self.files
        if session.rank == 0:
            inner, write_model = unwrap(objects.model), self.write_model

            def job() -> None:
                staging = session.staging_dir(snapshot.step)
                with full_disk_reported(staging, staging.parent):
                    write_snapshot(snapshot, inner, write_model, files, staging, on_stage=on_stage)
                on_stage(snapshot.step, "before_commit")
                session.commit_checkpoint(snapshot.metrics, staging, snapshot.step)

        else:

            def job() -> None:
                session.commit_checkpoint(snapshot.metrics, None, snapshot.step)

        self.writer.submit(job)
        state.checkpoint_blocked_s += time.monotonic() - started

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; raise its error."""
        self.writer.wait()

    def drain(self, timeout_s: float) -> None:
        """On the way out of a failed run: let a save in flight commit, for at most ``timeout_s``."""
        self.writer.drain(timeout_s)


def take_snapshot(objects: TrainingObjects, state: TrainerState, *, rank: int, method: str) -> Snapshot:
    """CPU copies of this step's state; rank 0 also receives every rank's RNG state and the whole
    model and optimizer state (gathered from the shards under FSDP: every rank takes part)."""
    all_rng = all_gather_objects(rng_state_bytes())
    rank_state = objects.rank_state() if objects.rank_state is not None else None
    all_rank_states = all_gather_objects(rank_state) if objects.rank_state is not None else []
    parallel, model = objects.parallel, objects.model
    snapshot = Snapshot(
        step=state.step,
        metrics=state.metrics(),
        state_json=json.dumps(asdict(state), indent=2),
        scheduler_json=json.dumps(objects.scheduler.state_dict()),
        rng_files={layout.rng_file(r): data for r, data in enumerate(all_rng)}
        | {layout.rollouts_file(r): text.encode() for r, text in enumerate(all_rank_states) if text is not None},
        model_state=parallel.model_state(model, method, rank),
        optimizer_state=parallel.optimizer_state(model, objects.optimizer, rank),
    )
    if snapshot.model_state is not None:
        check_full_shapes(snapshot.model_state, model)
        snapshot.scaler_state = objects.scaler.state_dict() if objects.scaler is not None else None
    return snapshot


def rng_state_bytes() -> bytes:
    """This rank's torch (CPU and CUDA) and Python RNG states, serialized with ``torch.save``."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_snapshot(
    snapshot: Snapshot,
    model: torch.nn.Module,
    write_model: WriteModel,
    files: ModelFiles,
    directory: Path,
    *,
    on_stage: SaveStageHook,
) -> None:
    """Write a whole checkpoint into ``directory``, its manifest last."""
    import torch

    shutil.rmtree(directory, ignore_errors=True)
    write_model(model, directory, snapshot.model_state)
    on_stage(snapshot.step, "model_files")
    trainer = directory / layout.TRAINER_SUBDIR
    trainer.mkdir(parents=True, exist_ok=True)
    torch.save(snapshot.optimizer_state, trainer / layout.OPTIMIZER_FILE)
    on_stage(snapshot.step, "trainer_files")
    (trainer / layout.SCHEDULER_FILE).write_text(snapshot.scheduler_json)
    (trainer / layout.STATE_FILE).write_text(snapshot.state_json)
    if snapshot.scaler_state is not None:
        torch.save(snapshot.scaler_state, trainer / "scaler.pt")
    for name, data in snapshot.rng_files.items():
        (trainer / name).write_bytes(data)
    on_stage(snapshot.step, "before_manifest")
    write_manifest(directory, snapshot.step, snapshot.metrics, files.lineage)


def write_model_files(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    files: ModelFiles,
    directory: Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """Weights (adapter or full) as safetensors, tokenizer with chat template, generation config
    whose EOS ids include the end-of-turn token (a model that generates), and the resolved config (secrets
    redacted).

    ``state_dict`` (a snapshot) is written instead of the live weights when given. A LoRA adapter
    is read back and checked before anything else is written (:func:`check_written_adapter`).
    """
    inner = transformers_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    if state_dict is None:  # PEFT types the directory as a str
        inner.save_pretrained(str(directory), safe_serialization=True)
    else:
        inner.save_pretrained(str(directory), safe_serialization=True, state_dict=state_dict)
    if files.method == "lora":
        saved = list(state_dict) if state_dict is not None else trainable_names(inner)
        modules = sum(".lora_A." in name for name in saved)
        check_written_adapter(directory, files.lora_r, modules=modules, untrained_allowed=files.untrained_allowed)
    tokenizer.save_pretrained(directory)
    generation = _generation_config(inner, tokenizer)
    if generation is not None:  # a model that does not generate (a reward model's classifier) has none
        generation.save_pretrained(directory)
    (directory / layout.CHECKPOINT_CONFIG_FILE).write_text(redact(files.resolved_config), encoding="utf-8")
    share_like_siblings(directory)  # the weights are written 0600 through a temporary file


def check_written_adapter(directory: Path, r: int, *, modules: int, untrained_allowed: bool = False) -> None:
    """Read back the adapter just written to ``directory`` and refuse it (the checkpoint then never
    counts) unless it holds ``modules`` adapted modules, each with lora_A (r x in) and lora_B
    (out x r), finite, with no lora_B left all zero: the forms in which sharded trainers are known
    to save adapters empty, as one rank's slice, or untrained (unless ``untrained_allowed``)."""
    problems, summary = check_adapter(directory, expected_r=r, zero_b_allowed=untrained_allowed)
    if summary is not None and len(summary.modules) != modules:
        problems.append(f"it adapts {len(summary.modules)} modules, but the model trains {modules}")
    if problems:
        raise CheckpointError(f"the adapter written to {directory} is not usable: {'; '.join(problems)}")


def _generation_config(model: TransformersModel, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig | None:
    import copy

    base = base_model(model)
    if getattr(base, "generation_config", None) is None:
        return None
    generation = copy.deepcopy(base.generation_config)
    eos = generation.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    generation.eos_token_id = sorted(eos_ids) if len(eos_ids) > 1 else next(iter(eos_ids), None)
    generation.pad_token_id = tokenizer.pad_token_id
    return generation


def restore_training_state(
    directory: Path,
    parallel: Parallelism,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    rank: int,
) -> TrainerState:
    """Load optimizer, scheduler, loop state and this rank's RNG from a checkpoint directory. The
    optimizer state is sharded as ``model`` is, whatever strategy and worker count saved it.

    Only tensors and plain Python values are unpickled (``weights_only=True``).
    """
    import torch

    trainer = directory / layout.TRAINER_SUBDIR
    saved = torch.load(trainer / layout.OPTIMIZER_FILE, weights_only=True, map_location="cpu")
    parallel.load_optimizer_state(model, optimizer, saved)
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


def _as_random_state(value: tuple[int, Sequence[int], float | None]) -> tuple[int, tuple[int, ...], float | None]:
    """Python's random state as ``random.setstate`` takes it (a checkpoint stores its middle part as a list)."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def save_final(
    model: torch.nn.Module,
    write_model: WriteModel,
    files: ModelFiles,
    state: TrainerState,
    run_dir: Path,
    *,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``final/`` (model files, config, manifest) atomically into ``run_dir``; the model's
    live weights, or ``weights`` (gathered from the shards of a sharded model) when given."""
    target = run_dir / layout.FINAL_DIR
    staging = staging_dir(target)
    with full_disk_reported(staging, run_dir / layout.CHECKPOINTS_DIR):
        write_model(model, staging, weights)
        write_manifest(staging, state.step, state.metrics(), files.lineage | {"final": True})
    replace_dir(staging, target)
    log.info("wrote %s (step %d)", target, state.step)
    return target
