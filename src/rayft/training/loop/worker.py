"""The per-worker training loop: set up (or restore), step, log, evaluate, save, finish.

The same function runs on every Ray Train worker and in-process without Ray; the
:class:`~rayft.training.loop.session.TrainSession` it is given is the only difference.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayft.config.train import TrainConfig
from rayft.errors import TrainingError
from rayft.models.architecture import resolve_architecture
from rayft.models.resolve import sources_resolved_once
from rayft.runs import layout
from rayft.runs.checkpoints import remove_incomplete, resume_checkpoint
from rayft.runs.stop import StopWatch
from rayft.runs.store import open_store
from rayft.training.loop.batches import Batch, TrainBatch, Unit, epoch_micro_batches, micro_batches, with_lookahead
from rayft.training.loop.callbacks import Callbacks, StepInfo, load_callbacks
from rayft.training.loop.checkpointing import (
    Checkpointer,
    ModelFiles,
    TrainerState,
    TrainingObjects,
    restore_training_state,
    save_final,
)
from rayft.training.loop.heap import process_allocator, set_mmap_threshold
from rayft.training.loop.loggers import open_loggers
from rayft.training.loop.method import Method, MethodCatalog, MethodTraits
from rayft.training.loop.metrics import MetricLogger, ThroughputWindow
from rayft.training.loop.plan import is_due, learning_rate_factor, units_before_step
from rayft.training.loop.session import TrainSession, all_reduce_sum
from rayft.training.loop.steps import StepStats, train_step
from rayft.training.loop.timing import StepProfile, open_step_profile
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.modeling.model import count_parameters, parameter_groups
from rayft.training.modeling.precision import Precision, resolve_precision
from rayft.training.modeling.step_choice import StepRequest, choose_step
from rayft.training.modeling.step_facts import gather_step_facts, model_shape, worker_cpus
from rayft.training.strategies.memory import estimate_worker_memory, memory_problem
from rayft.training.strategies.parallel import Parallelism, ParallelSetup
from rayft.training.strategies.table import parallelism

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rayft.train")


@dataclass
class Worker:
    """The live objects of one worker's run."""

    plan: WorkerPlan
    session: TrainSession
    parallel: Parallelism
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    method: Method
    precision: Precision
    logger: MetricLogger
    state: TrainerState
    checkpoints: Checkpointer
    stop: StopWatch
    profile: StepProfile
    callbacks: Callbacks
    info: StepInfo
    stopped_on_request: bool = False
    window: ThroughputWindow = field(default_factory=ThroughputWindow)
    window_units: float = 0.0  # every worker's loss terms (pairs, for preference training) since the last log line


@sources_resolved_once()  # the model's source, asked for by every part the worker builds, is resolved once
def run_worker(plan: WorkerPlan, session: TrainSession, methods: MethodCatalog) -> TrainerState:
    """Train from the start or from the latest checkpoint to the end of the schedule (``methods``: where
    the plan's training method comes from, :mod:`rayft.training.methods.registry`)."""
    worker = setup_worker(plan, session, methods)
    timer = worker.profile.timer
    try:
        timer.start()
        worker.callbacks.call("on_train_start", worker.info)
        batches = step_batches(
            plan, session, worker.state.step, worker.method, callbacks=worker.callbacks, info=worker.info
        )
        for loaded, ahead in with_lookahead(batches, worker.method.lookahead):
            # Time a callback spends before the step counts as data_wait, as a slow loader's does.
            begin_step(worker, loaded)
            timer.lap("data_wait")
            stats = run_step(worker, prepare(worker, loaded, ahead))
            after_step(worker, stats)
            end_step(worker, stats)
            worker.profile.step_done()
            stopping = worker.state.stopped_early or stop_requested(worker)
            timer.lap("comm")  # the stop request's all-reduce
            if stopping:
                break
        worker.profile.close()
        finish(worker)
        worker.callbacks.call("on_train_end", worker.info)
    except BaseException:
        worker.checkpoints.drain(timeout_s=120.0)
        raise
    finally:
        worker.profile.close()
        worker.stop.close()
        worker.logger.close()
        worker.method.close()
    return worker.state


def begin_step(worker: Worker, loaded: list[Batch]) -> None:
    """Tell the callbacks which step is about to run, and on which samples."""
    if not worker.callbacks.wants("on_step_begin"):
        return
    worker.info.step = worker.state.step + 1
    worker.info.sample_ids = [i for b in loaded for i in b.sample_ids]
    worker.callbacks.call("on_step_begin", worker.info)


def end_step(worker: Worker, stats: StepStats) -> None:
    """Tell the callbacks the step that was just taken, with its loss."""
    if not worker.callbacks.wants("on_step_end"):
        return
    worker.info.step = worker.state.step
    worker.info.metrics = {"train/loss": stats.loss, "train/grad_norm": stats.grad_norm}
    worker.callbacks.call("on_step_end", worker.info)


def stop_requested(worker: Worker) -> bool:
    """Whether the driver asked the run to stop (SIGTERM); all workers agree on the same step."""
    local = worker.stop.requested()
    if worker.session.world_size > 1:
        local = all_reduce_sum([float(local)], worker.session.device)[0] > 0
    if local:
        worker.stopped_on_request = True
    return local


def setup_worker(plan: WorkerPlan, session: TrainSession, methods: MethodCatalog) -> Worker:
    """Seed, load the model (restored if a checkpoint exists), and build the optimizer."""
    import torch

    set_mmap_threshold(plan.train.malloc_mmap_threshold_bytes)  # before the model: its load frees blocks too
    if session.rank == 0:
        log.info("worker's allocator: %s", process_allocator())
    torch.manual_seed(plan.seed)
    traits = methods.traits(plan)
    plan = choose_worker_step(plan, session, traits)
    method = methods.build(plan, model_files(plan, traits))
    checkpoints = plan.run_dir / layout.CHECKPOINTS_DIR
    if session.rank == 0:
        remove_incomplete(checkpoints)  # staging directories of saves a crash interrupted
    parallel = parallelism(plan.train.strategy, session.world_size)
    with session.restored_checkpoint() as candidate:
        restore_dir = resume_checkpoint(candidate, checkpoints)
        # bitsandbytes quantizes a base as it loads it, so there is no empty quantized model for rank 0 to fill:
        # under DDP (the one strategy a quantized base allows) every worker loads and quantizes its own copy.
        quantized = plan.lora.applied_quantize(plan.train.method) != "none"
        weights = session.rank == 0 or not parallel.weights_from_rank0 or quantized
        model = method.build_model(restore_dir, device_type=session.device.type, weights=weights)
        precision = resolve_precision(plan.train.mixed_precision, session.device.type, method.model_type)
        check_device_memory(model, plan.train, parallel, precision, session)
        model, optimizer = parallel.prepare(
            model, lambda net: build_optimizer(net, plan.train), parallel_setup(plan.train, session, precision)
        )
        method.use_strategy(parallel)
        scheduler = build_scheduler(optimizer, plan.train, plan.schedule.total_steps * method.updates_per_step)
        state = TrainerState()
        torch.manual_seed(plan.seed + 1 + session.rank)  # distinct dropout streams per worker
        method.restore(restore_dir, session.rank)
        if restore_dir is not None:
            state = restore_training_state(restore_dir, parallel, model, optimizer, scheduler, rank=session.rank)
            if plan.retuned:
                apply_optimizer_settings(optimizer, scheduler, plan.train)
            log.info("rank %d resumed from %s at step %d", session.rank, restore_dir, state.step)
    scaler = torch.amp.GradScaler("cuda") if precision.use_grad_scaler else None
    logger = open_loggers(plan, session, state.step)
    trainable, total = count_parameters(model)
    if session.rank == 0:
        log.info("training %s parameters of %s (%.2f%%)", f"{trainable:,}", f"{total:,}", 100 * trainable / total)
    callbacks = load_callbacks(plan.train.callbacks)
    saver = Checkpointer(
        session, model_files(plan, traits), method.write_model, background=plan.checkpoint.async_upload,
        on_stage=lambda step, stage: callbacks.call("on_save_stage", step, stage),
    )  # fmt: skip
    # Rank 0 watches a remote run's URI for a stop request (the others learn it at the next step).
    stop = StopWatch(plan.location, poll=session.rank == 0)
    info = StepInfo(session.rank, session.world_size, str(plan.run_dir), step=state.step, stop_requested=stop.requested)
    profile = open_step_profile(plan.train.profile, session, plan.location, params=total, start_step=state.step)
    method.start(session)
    return Worker(
        plan, session, parallel, model, optimizer, scheduler, scaler, method, precision, logger, state, saver, stop,
        profile, callbacks, info,
    )  # fmt: skip


def choose_worker_step(plan: WorkerPlan, session: TrainSession, traits: MethodTraits) -> WorkerPlan:
    """The plan with the step's ``auto`` settings decided for this worker's device and model
    (:func:`rayft.training.modeling.step_choice.choose_step`); rank 0 says what was chosen and why. On CPU,
    torch's thread count is set. A custom task or an encoder-decoder keeps its settings (threads apart)."""
    import torch

    device_type = session.device.type
    request = StepRequest(plan.model.attn_implementation, plan.train.fused_loss, plan.train.compile,
                          plan.train.mixed_precision, plan.train.cpu_threads, plan.train.padding_free,
                          plan.train.frozen_precision)  # fmt: skip
    causal = plan.task is None and resolve_architecture(plan.model) == "causal"
    shape = model_shape(plan.model) if causal else {"hidden_size": 0, "num_layers": 0, "vocab_size": 0}
    facts = gather_step_facts(
        device_type, method=plan.train.method, seq_length=plan.max_seq_length,
        micro_batch_size=plan.train.micro_batch_size, packing=plan.packing and traits.token_loss,
        cpus=worker_cpus(), sft=traits.token_loss, strategy=plan.train.strategy,
        reference_copy=traits.reference_copy, dora=plan.train.method == "lora" and plan.lora.use_dora, **shape,
    )  # fmt: skip
    choice = choose_step(request, facts)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    if not causal:
        return plan
    if session.rank == 0:
        log.info("step: %s", choice.describe())
    return plan.with_step(choice)


def model_files(plan: WorkerPlan, traits: MethodTraits) -> ModelFiles:
    """What the run writes beside the weights; every manifest records the method, the base model
    (or the task) and the driver's lineage (world size, data key). A task's model is saved whole."""
    if plan.task is not None:
        return ModelFiles("full", 0, plan.resolved_config, {"method": "task", "task": plan.task.path, **plan.lineage})
    lineage = {"method": plan.train.method, "base_model": plan.model.name, **plan.lineage}
    return ModelFiles(
        plan.train.method, plan.lora.r, plan.resolved_config, lineage, untrained_allowed=traits.untrained_allowed
    )


def save_checkpoint(worker: Worker) -> None:
    """Save the current step of the loop (see :meth:`Checkpointer.save`)."""
    objects = TrainingObjects(
        worker.parallel, worker.model, worker.optimizer, worker.scheduler, worker.scaler, worker.method.rank_state
    )
    worker.checkpoints.save(objects, worker.state)


def check_device_memory(
    model: torch.nn.Module, train: TrainConfig, parallel: Parallelism, precision: Precision, session: TrainSession
) -> None:
    """Before the model goes to a GPU: fail at once when its weights, gradients and optimizer state
    alone cannot fit the GPU's free memory (see :mod:`rayft.training.strategies.memory`)."""
    import torch

    if session.device.type != "cuda":
        return
    trainable, total = count_parameters(model)
    estimate = estimate_worker_memory(
        total_params=total, trainable_params=trainable, weight_bytes=next(model.parameters()).element_size(),
        sharded=parallel.sharded, world_size=session.world_size,
        master_copy=train.strategy == "deepspeed" and precision.autocast_dtype is not None,
    )  # fmt: skip
    free, _ = torch.cuda.mem_get_info(session.device)
    where = f"GPU {session.device} of rank {session.rank}"
    problem = memory_problem(estimate, free, where=where, strategy=train.strategy, method=train.method)
    if problem is not None:
        raise TrainingError(problem)
    log.info("rank %d: model state about %s on %s (%.1f GiB free)", session.rank, estimate.describe(), where,
             free / 2**30)  # fmt: skip


def parallel_setup(train: TrainConfig, session: TrainSession, precision: Precision) -> ParallelSetup:
    """What the run's strategy needs to know on this worker."""
    return ParallelSetup(
        device=session.device, world_size=session.world_size, precision=precision,
        micro_batch_size=train.micro_batch_size, max_grad_norm=train.max_grad_norm, deepspeed=train.deepspeed,
    )  # fmt: skip


def build_optimizer(model: torch.nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters."""
    import torch

    return torch.optim.AdamW(
        parameter_groups(model, train.weight_decay), lr=train.learning_rate, betas=train.adam_betas, eps=train.adam_eps
    )


def apply_optimizer_settings(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, train: TrainConfig
) -> None:
    """Set ``train``'s learning rate and weight decay on a restored optimizer and scheduler (whose
    saved state holds the earlier ones), at the scheduler's current step: the next update uses them."""
    scheduler.base_lrs = [train.learning_rate] * len(optimizer.param_groups)
    for index, group in enumerate(optimizer.param_groups):
        group["initial_lr"] = train.learning_rate
        group["lr"] = train.learning_rate * scheduler.lr_lambdas[index](scheduler.last_epoch)
        if index == 0:  # the matrices; the second group (biases, norms) never decays
            group["weight_decay"] = train.weight_decay


def build_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to ``min_learning_rate``."""
    import torch

    min_ratio = train.min_learning_rate / train.learning_rate
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(step, train.warmup_steps, total_steps, min_ratio)
    )


def step_batches(
    plan: WorkerPlan,
    session: TrainSession,
    start_step: int,
    method: Method,
    *,
    callbacks: Callbacks | None = None,
    info: StepInfo | None = None,
) -> Iterator[list[Batch]]:
    """The micro-batches of every remaining optimizer step, epoch after epoch, resuming exactly
    after the units consumed before ``start_step`` (``callbacks`` see each micro-batch on its way)."""
    sched, train = plan.schedule, plan.train
    step = start_step
    while step < sched.total_steps:
        epoch = step // sched.steps_per_epoch
        units = epoch_micro_batches(
            session.windows("train", plan.shuffle_window), seed=plan.seed, epoch=epoch, rank=session.rank,
            micro_batch_size=train.micro_batch_size, units_per_rank=sched.units_per_rank,
            skip_units=units_before_step(sched, step, train.micro_batch_size, train.gradient_accumulation_steps),
        )  # fmt: skip
        collated = (method.collate(announced(chunk, callbacks, info)) for chunk in units)
        for group in micro_batches(collated, train.gradient_accumulation_steps):
            yield [b.to(session.device) for b in group]
            step += 1
            if step >= sched.total_steps:
                return


def announced(units: list[Unit], callbacks: Callbacks | None, info: StepInfo | None) -> list[Unit]:
    """``units``, after the callbacks' ``on_micro_batch`` (on the way to their collation)."""
    if callbacks is not None and info is not None and callbacks.wants("on_micro_batch"):
        callbacks.call("on_micro_batch", info)
    return units


def prepare(worker: Worker, loaded: list[Batch], ahead: list[list[Batch]]) -> list[TrainBatch]:
    """What the step trains on, from its collated micro-batches (GRPO: the completions sampled from its
    prompts and scored)."""
    method = worker.method
    batches = method.prepare(worker.model, loaded, ahead, step=worker.state.step + 1, precision=worker.precision,
                             device=worker.session.device)  # fmt: skip
    if method.prepare_phase is not None:
        worker.profile.timer.lap(method.prepare_phase)
        for part, seconds in method.phase_parts().items():
            worker.profile.timer.part(part, seconds)
    return batches


def run_step(worker: Worker, batches: Sequence[TrainBatch]) -> StepStats:
    """One training step: the method's optimizer updates on ``batches`` (one, or GRPO's
    ``train.rl.steps_per_rollout``), then the method's turn after it. The step's figures: the updates' mean
    loss, the last gradient norm, and the tokens of every update."""
    updates = [update(worker, batches, worker.state.step + 1) for _ in range(worker.method.updates_per_step)]
    worker.profile.timer.end_step()
    worker.state.step += 1
    if worker.state.step < worker.plan.schedule.total_steps:  # the last weights go nowhere
        worker.method.after_update(worker.model, worker.state.step)
    if len(updates) == 1:
        return updates[0]
    return StepStats(
        loss=sum(u.loss for u in updates) / len(updates), label_tokens=sum(u.label_tokens for u in updates),
        real_tokens=sum(u.real_tokens for u in updates), computed_tokens=sum(u.computed_tokens for u in updates),
        grad_norm=updates[-1].grad_norm,
    )  # fmt: skip


def update(worker: Worker, batches: Sequence[TrainBatch], step: int) -> StepStats:
    """One optimizer update on ``batches``; a non-finite loss stops the run with a clear error."""
    method, precision = worker.method, worker.precision
    stats = train_step(
        worker.model, worker.optimizer, worker.scheduler, batches, parallel=worker.parallel, precision=precision,
        scaler=worker.scaler, max_grad_norm=worker.plan.train.max_grad_norm,
        world_size=worker.session.world_size, device=worker.session.device,
        loss_fn=lambda model, batch: method.loss_sum(model, batch, precision), timer=worker.profile.timer,
    )  # fmt: skip
    if not math.isfinite(stats.loss):
        raise TrainingError(
            f"training loss became {stats.loss} at step {step}; lower train.learning_rate, "
            "set train.max_grad_norm, or check the data for empty or corrupt rows"
        )
    return stats


def after_step(worker: Worker, stats: StepStats) -> None:
    """Log, evaluate, stop early and save when due."""
    plan, state = worker.plan, worker.state
    total = plan.schedule.total_steps
    record_throughput(worker, stats)
    timer = worker.profile.timer
    if is_due(state.step, plan.train.logging_steps, total):
        worker.logger.log(state.step, step_metrics(worker, stats))
        timer.skip()  # writing the metrics is no phase of a step
    save_due = is_due(state.step, plan.train.save_steps, total)
    # Every checkpoint carries a fresh validation loss: "best" checkpoints are ranked by it.
    if plan.has_validation and (save_due or is_due(state.step, plan.train.eval_steps, total)):
        run_evaluation(worker)
        timer.lap("eval")
    if save_due or state.stopped_early:
        started = time.monotonic()
        save_checkpoint(worker)
        timer.lap("checkpoint")
        worker.logger.log(state.step, {"checkpoint/save_seconds": time.monotonic() - started})
    worker.window.restart()  # tokens/s counts training time only


def record_throughput(worker: Worker, stats: StepStats) -> None:
    """Accumulate real and computed tokens for tokens/s and padding efficiency."""
    worker.window.add_step(stats.real_tokens, stats.computed_tokens)
    worker.window_units += stats.label_tokens
    worker.state.real_tokens += stats.real_tokens
    worker.state.computed_tokens += stats.computed_tokens


def step_metrics(worker: Worker, stats: StepStats) -> dict[str, float]:
    """The per-step metrics, with tokens/s (examples/s for a custom task) over the steps since the
    last log line."""
    unit = worker.method.throughput_unit
    rate = worker.window.take_tokens_per_s()
    metrics = {
        "train/loss": stats.loss,
        "train/learning_rate": float(worker.scheduler.get_last_lr()[0]),
        "train/grad_norm": stats.grad_norm,
        f"train/{unit}_per_s": rate,
        "train/epoch": worker.state.step / worker.plan.schedule.steps_per_epoch,
        **worker.profile.window_metrics(worker.state.step, rate if unit == "tokens" else None),
    }
    if unit == "tokens":
        metrics["train/padding_efficiency"] = worker.state.real_tokens / max(worker.state.computed_tokens, 1)
    # Every rank joins.
    metrics.update(worker.method.figures(worker.session.device, world_size=worker.session.world_size,
                                         units=worker.window_units))  # fmt: skip
    worker.window_units = 0.0
    worker.state.last_train_loss = stats.loss
    return metrics


def run_evaluation(worker: Worker) -> None:
    """Validation figures over every worker's shard (loss and perplexity, or a task's loss and
    metrics); updates early stopping, and the figures travel with the next checkpoint."""
    plan, state = worker.plan, worker.state
    size = plan.train.eval_micro_batch_size or plan.train.micro_batch_size
    units = (u for window in worker.session.windows("validation", plan.shuffle_window) for u in window)
    figures = worker.method.evaluate(
        worker.model, units, batch_size=size, precision=worker.precision, device=worker.session.device,
        lockstep=worker.parallel.sharded,
    )  # fmt: skip
    state.record_eval(figures["eval/loss"], plan.train.early_stopping_patience)
    state.eval_metrics = {name: v for name, v in figures.items() if name not in ("eval/loss", "eval/perplexity")}
    worker.logger.log(state.step, figures)
    if state.stopped_early:
        log.info("early stopping at step %d: no lower validation loss in %d evaluations", state.step,
                 plan.train.early_stopping_patience)  # fmt: skip


def finish(worker: Worker) -> None:
    """Wait for the last checkpoint to be committed, then write final/ (rank 0) and, with a remote
    ``storage_path``, upload it and the logs. A run stopped on request saves a checkpoint of the
    current step instead, for ``--resume``."""
    if worker.stopped_on_request and worker.state.step < worker.plan.schedule.total_steps:
        if not is_due(worker.state.step, worker.plan.train.save_steps, worker.plan.schedule.total_steps):
            save_checkpoint(worker)
        worker.checkpoints.wait()
        log.info("rank %d stopped on request after saving step %d", worker.session.rank, worker.state.step)
        return
    worker.checkpoints.wait()
    # A sharded model is gathered by every rank; rank 0 writes it.
    weights = None
    if worker.parallel.sharded:
        weights = worker.parallel.model_state(worker.model, worker.plan.train.method, worker.session.rank)
    if worker.session.rank == 0:
        files = worker.checkpoints.files
        save_final(worker.model, worker.method.write_model, files, worker.state, worker.plan.run_dir, weights=weights)
        open_store(worker.plan.location).persist_final(flush=worker.logger.close)
