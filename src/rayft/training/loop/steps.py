"""One optimizer step and one evaluation pass: the numerical core of the training loop.

The loss of a step is the sum of token cross-entropies over the label tokens of every
micro-batch on every worker, divided by the number of those tokens. So the update is the same
whatever the split into workers and micro-batches (4x2 = 2x4), and padding never counts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rayft.data.collate import MicroBatch
from rayft.data.prepared import IGNORE_INDEX
from rayft.training.loop.batches import TrainBatch
from rayft.training.loop.session import all_gather_objects, all_reduce_sum
from rayft.training.modeling.attention import training_attention, uses_varlen
from rayft.training.modeling.loss import LossKind, fused_head, resolve_loss
from rayft.training.modeling.model import base_model, unwrap
from rayft.training.modeling.precision import Precision
from rayft.training.profiling.breakdown import StepTimer

if TYPE_CHECKING:
    import torch

    from rayft.training.strategies.parallel import Parallelism


@dataclass(frozen=True)
class StepStats:
    """Global (all-worker) figures of one optimizer step."""

    loss: float
    label_tokens: int
    real_tokens: int
    computed_tokens: int
    grad_norm: float


def token_loss_sum(
    model: torch.nn.Module, batch: MicroBatch, precision: Precision, *, loss: LossKind = "none", varlen: bool = False
) -> torch.Tensor:
    """Sum of next-token cross-entropies over the label tokens of a micro-batch.

    Logits are computed only at the positions whose next token some row of the batch trains on
    (transformers' ``logits_to_keep``): prompt and padding positions skip the vocabulary projection,
    which dominates small models. With ``loss`` 'chunked' or 'liger' even those logits never exist
    all at once (:mod:`rayft.training.modeling.loss`). ``varlen`` passes the examples' bounds for
    variable-length attention kernels (:meth:`MicroBatch.varlen_kwargs`).
    """
    import torch
    from torch.nn.functional import cross_entropy

    if batch.seq2seq:
        return pair_loss_sum(model, batch, precision)
    targets = batch.labels[:, 1:]
    kwargs: dict[str, Any] = batch.varlen_kwargs() if varlen else {}
    keep_logits = _takes_logits_to_keep(model)
    if keep_logits:
        keep = (targets != IGNORE_INDEX).any(dim=0).nonzero().flatten()
        kwargs["logits_to_keep"] = keep
        targets = targets[:, keep]
    autocast = (
        torch.autocast(device_type=batch.input_ids.device.type, dtype=precision.autocast_dtype)
        if precision.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    head = fused_head(model, targets, loss, shifted=not keep_logits) if loss != "none" else contextlib.nullcontext()
    with autocast, head:
        out = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, **kwargs).logits
    if loss != "none":
        return out  # type: ignore[no-any-return] # the head returned the loss sum
    shifted = (out if keep_logits else out[:, :-1]).float()
    return cross_entropy(
        shifted.reshape(-1, shifted.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def pair_loss_sum(model: torch.nn.Module, batch: MicroBatch, precision: Precision) -> torch.Tensor:
    """Sum of cross-entropies over the target tokens of an encoder-decoder's micro-batch: the model
    encodes the sources (with their padding mask) and decodes the targets shifted right behind its
    decoder start token, as transformers builds them from ``labels``. The decoder's logits cover the
    targets alone (short next to a causal LM's prompt and response), so no fused loss is needed."""
    import torch
    from torch.nn.functional import cross_entropy

    autocast = (
        torch.autocast(device_type=batch.input_ids.device.type, dtype=precision.autocast_dtype)
        if precision.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with autocast:
        out = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels, use_cache=False
        )
    logits = out.logits.float()
    return cross_entropy(
        logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def step_options(
    attn_implementation: str, fused_loss: str, device_type: str, *, seq2seq: bool = False
) -> dict[str, Any]:
    """The ``loss`` and ``varlen`` arguments of :func:`train_step` and :func:`evaluate` for the
    configured attention and ``train.fused_loss`` on ``device_type`` (an encoder-decoder takes the
    plain loss over its targets and padded attention: :func:`pair_loss_sum`)."""
    if seq2seq:
        return {"loss": "none", "varlen": False}
    chosen = training_attention(attn_implementation, device_type)
    return {"loss": resolve_loss(fused_loss, device_type), "varlen": uses_varlen(chosen)}


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the causal LM inside DDP / PEFT wrappers accepts ``logits_to_keep``."""
    # A class is hashable; mypy checks the instances' __hash__ instead.
    return _forward_takes_logits_to_keep(type(base_model(model)))  # type: ignore[arg-type]


@functools.cache
def _forward_takes_logits_to_keep(model_class: type[torch.nn.Module]) -> bool:
    """Read once per model class, not on every micro-batch."""
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batches: Sequence[TrainBatch],
    *,
    parallel: Parallelism,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
    max_grad_norm: float | None,
    world_size: int,
    device: torch.device,
    loss: LossKind = "none",
    varlen: bool = False,
    loss_fn: Callable[[torch.nn.Module, TrainBatch], torch.Tensor] | None = None,
    timer: StepTimer | None = None,
) -> StepStats:
    """Accumulate gradients over ``batches``, clip, and take one optimizer step (as ``parallel``,
    the run's strategy, does each of these). ``loss`` and ``varlen``: see :func:`token_loss_sum`;
    ``loss_fn(model, batch)`` replaces it when given (the sum of the batch's ``num_label_tokens``
    loss terms, see :class:`rayft.training.loop.method.Method`). ``timer`` gets a lap at the end
    of each phase (communication, forward, backward, optimizer)."""
    import torch

    lap = timer.lap if timer is not None else _no_lap

    local = [sum(b.num_label_tokens for b in batches), sum(b.num_tokens for b in batches)]
    local.append(sum(b.num_computed_tokens for b in batches))
    label_tokens, real_tokens, computed_tokens = all_reduce_sum(local, device)
    lap("comm")
    # Every strategy averages gradients over workers; multiplying by world_size turns that into a sum.
    scale = world_size / max(label_tokens, 1.0)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for index, batch in enumerate(batches):
        with parallel.accumulating(model, last=index == len(batches) - 1):
            if loss_fn is not None:
                batch_loss = loss_fn(model, batch)
            else:
                token_batch = cast("MicroBatch", batch)  # without loss_fn, the batches are token micro-batches
                batch_loss = token_loss_sum(model, token_batch, precision, loss=loss, varlen=varlen)
            lap("forward")
            parallel.backward(model, batch_loss * scale, scaler)
        loss_sum += batch_loss.detach().double()
        lap("backward")  # with DDP, the gradient all-reduce that overlaps it too
    grad_norm = parallel.step(model, optimizer, scaler, max_grad_norm)
    scheduler.step()
    lap("optimizer")
    (total_loss,) = all_reduce_sum([float(loss_sum)], device)
    lap("comm")
    return StepStats(
        total_loss / max(label_tokens, 1.0), int(label_tokens), int(real_tokens), int(computed_tokens), grad_norm
    )


def _no_lap(phase: str) -> None:
    """No timer: nothing to record."""


def evaluate(
    model: torch.nn.Module,
    batches: Iterable[MicroBatch],
    *,
    precision: Precision,
    device: torch.device,
    lockstep: bool = False,
    loss: LossKind = "none",
    varlen: bool = False,
    seq2seq: bool = False,
) -> tuple[float, int]:
    """Mean token loss over every worker's validation batches, and the label-token count.

    Runs the module a DDP wrapper holds, not the wrapper, so that no worker waits on a collective
    inside the forward pass. A sharded model gathers its blocks in every forward: with ``lockstep`` every
    worker runs as many forwards as the one with the most batches (the extra ones are idle; an
    encoder-decoder's with ``seq2seq``).
    """
    import torch

    inner = unwrap(model)
    if lockstep:
        batches = in_lockstep(list(batches), seq2seq=seq2seq)
    was_training = inner.training
    inner.eval()
    loss_sum, tokens = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss_sum += float(token_loss_sum(inner, batch.to(device), precision, loss=loss, varlen=varlen))
            tokens += batch.num_label_tokens
    inner.train(was_training)
    total_loss, total_tokens = all_reduce_sum([loss_sum, float(tokens)], device)
    return total_loss / max(total_tokens, 1.0), int(total_tokens)


def in_lockstep(batches: list[MicroBatch], *, seq2seq: bool = False) -> list[MicroBatch]:
    """``batches`` followed by idle ones (one token, no label) up to the most any worker has
    (with ``seq2seq``, an encoder-decoder's: one source token, one unlabelled target)."""
    import torch

    most = max(all_gather_objects(len(batches)))
    idle = MicroBatch(
        torch.zeros((1, 1), dtype=torch.long),
        torch.full((1, 1), IGNORE_INDEX, dtype=torch.long),
        torch.zeros((1, 1), dtype=torch.long),
        num_tokens=0,
        num_label_tokens=0,
        sample_ids=[],
        attention_mask=torch.ones((1, 1), dtype=torch.long) if seq2seq else None,
    )
    return batches + [idle] * (most - len(batches))


def to_device(batches: Iterator[MicroBatch], device: torch.device) -> Iterator[MicroBatch]:
    """Move each micro-batch to ``device`` as it is consumed."""
    for batch in batches:
        yield batch.to(device)
