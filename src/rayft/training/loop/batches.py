"""The order in which a worker consumes its training units, and grouping them into steps.

A worker reads its shard as a stream of *windows* (fixed-size runs of units, in storage order).
Each window is permuted with a generator seeded by (seed, epoch, rank, window index), so the
order of an epoch depends on nothing but those four numbers: a restarted worker replays it
exactly and skips the units it already consumed, and 4x2 or 2x4 batch geometries see the same
units in the same steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import torch
    from typing_extensions import Self

    from rayft.data.collate import MicroBatch

Unit = dict[str, Any]
T = TypeVar("T")


class Batch(Protocol):
    """A collated micro-batch as the loop moves it: to the worker's device, its sample ids logged
    (:class:`rayft.data.collate.MicroBatch`, a preference, prompt or rollout batch, a task's batch)."""

    @property
    def sample_ids(self) -> list[int]:
        """The ids of the samples it holds (each once)."""
        ...

    def to(self, device: torch.device) -> Self:
        """The same batch with its tensors on ``device``."""
        ...


class TrainBatch(Batch, Protocol):
    """A micro-batch a step trains on, with the counts the loss normalisation and the throughput read."""

    @property
    def num_label_tokens(self) -> int:
        """The loss terms it holds (label tokens; pairs, completions or examples for other objectives)."""
        ...

    @property
    def num_tokens(self) -> int:
        """Real tokens (padding excluded)."""
        ...

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the model computes, padding included."""
        ...


class OnRows:
    """The counts of a batch built on one collated micro-batch, ``rows`` (a preference or rollout
    batch): its sample ids and token counts are the rows'; its loss terms are its own."""

    rows: MicroBatch

    @property
    def sample_ids(self) -> list[int]:
        """The ids of the samples it holds (each once)."""
        return self.rows.sample_ids

    @property
    def num_tokens(self) -> int:
        """Real tokens (padding excluded)."""
        return self.rows.num_tokens

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the model computes, padding included."""
        return self.rows.num_computed_tokens


def shuffled_units(windows: Iterable[list[Unit]], seed: int, epoch: int, rank: int) -> Iterator[Unit]:
    """Yield the units of an epoch, each window permuted deterministically."""
    import numpy as np

    for index, window in enumerate(windows):
        rng = np.random.default_rng([seed, epoch, rank, index])
        for position in rng.permutation(len(window)):
            yield window[int(position)]


def micro_batches(units: Iterator[T], size: int) -> Iterator[list[T]]:
    """Group items into lists of ``size`` (the last one may be shorter)."""
    while chunk := list(islice(units, size)):
        yield chunk


def epoch_micro_batches(
    windows: Iterable[list[Unit]],
    *,
    seed: int,
    epoch: int,
    rank: int,
    micro_batch_size: int,
    units_per_rank: int,
    skip_units: int = 0,
) -> Iterator[list[Unit]]:
    """The micro-batches of one epoch on one rank, after skipping ``skip_units`` already consumed.

    Stops after ``units_per_rank`` units even if the stream holds more (all ranks must take the
    same number of steps).
    """
    units = islice(shuffled_units(windows, seed, epoch, rank), skip_units, units_per_rank)
    return micro_batches(units, micro_batch_size)


def with_lookahead(items: Iterator[T], depth: int) -> Iterator[tuple[T, list[T]]]:
    """Each item with the (up to) ``depth`` items after it, read ahead of time: the micro-batches of the
    steps a method looks at before they train (GRPO's asynchronous rollouts sample them meanwhile)."""
    window: deque[T] = deque()
    for item in items:
        window.append(item)
        if len(window) > depth:
            current = window.popleft()
            yield current, list(window)
    while window:
        current = window.popleft()
        yield current, list(window)
