"""Generating for a stream of prompts with one long-lived pool of backends, in bounded windows.

:func:`in_input_order` reads prompts a window at a time, sends each window's prompts longest first
(so that a batch holds prompts of similar length: less padding for local models) and gives each
window back, items with their generations, in input order. Memory is bounded by a window and the batches in
flight, whatever the number of prompts. The pool loads its model once and serves every window:
:class:`LocalPool` in this process, :class:`~rayft.generation.ray_pool.RayActorPool` on Ray actors.
A batch that fails is not dropped: its prompts come back with ``error`` set.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar, cast

from rayft.config.generation import GenerationConfig
from rayft.config.inference import GENERATION_WINDOW
from rayft.generation.backend import Generation, Prompt, generate_batch
from rayft.generation.factory import build_backend, sampling_params
from rayft.generation.ray_pool import RayActorPool

T = TypeVar("T")
Tag = TypeVar("Tag")
Runtime = Literal["ray", "local"]


class GenerationPool(Protocol):
    """Backends that generate batches of prompts, each batch given back with its tag, in the order given."""

    def map(self, batches: Iterable[tuple[Tag, list[Prompt]]]) -> Iterator[tuple[Tag, list[Generation]]]:
        """One list of generations per batch, in batch order (batches are pulled as capacity frees)."""
        ...


class LocalPool:
    """One backend in this process (the model loaded once), serving batches one after the other."""

    def __init__(self, cfg: GenerationConfig) -> None:
        self.backend = build_backend(cfg)
        self.params = sampling_params(cfg)

    def map(self, batches: Iterable[tuple[Tag, list[Prompt]]]) -> Iterator[tuple[Tag, list[Generation]]]:
        """Each batch generated as it is pulled."""
        for tag, prompts in batches:
            yield tag, generate_batch(self.backend, self.params, prompts)


@contextlib.contextmanager
def open_pool(cfg: GenerationConfig, runtime: Runtime) -> Iterator[GenerationPool]:
    """The pool of ``runtime`` for ``cfg``, its actors (on Ray) stopped on the way out."""
    if runtime == "local":
        yield LocalPool(cfg)
        return
    pool = RayActorPool(cfg)
    try:
        yield pool
    finally:
        pool.close()


def prompt_size(prompt: Prompt) -> int:
    """Characters of a prompt's text (every message's content for a chat prompt): a tokenizer-free
    proxy of its length."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(str(message.get("content", ""))) for message in prompt)


def window_batches(prompts: Sequence[Prompt], batch_size: int) -> list[list[int]]:
    """The positions of one window's prompts in batches: text prompts before chat ones (a batch holds
    one kind), each kind longest first, ties in input order."""
    batches: list[list[int]] = []
    for chat in (False, True):
        kind = [i for i, p in enumerate(prompts) if isinstance(p, list) == chat]
        kind.sort(key=lambda i: -prompt_size(prompts[i]))
        batches += [kind[start : start + batch_size] for start in range(0, len(kind), batch_size)]
    return batches


@dataclass
class _Window(Generic[T]):
    """A window's items, their generations as they arrive, and the batches still out."""

    items: list[T]
    generations: list[Generation | None]
    outstanding: int = 0


def in_input_order(
    items: Iterable[T],
    prompt_of: Callable[[T], Prompt],
    pool: GenerationPool,
    *,
    batch_size: int,
    window: int = GENERATION_WINDOW,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[list[tuple[T, Generation]]]:
    """Each window of items with the generations of their prompts, windows and items in input order.

    Items are read ``window`` at a time; while a window's last batches run, the next window's first
    ones are already queued (the pool pulls batches as it has room), so the pool does not idle at a
    window's end. ``on_batch`` is told the size of each batch done (for progress).
    """
    if window < 1 or batch_size < 1:
        raise ValueError(f"window ({window}) and batch_size ({batch_size}) must be at least 1")
    open_windows: deque[_Window[T]] = deque()

    def batches() -> Iterator[tuple[tuple[_Window[T], list[int]], list[Prompt]]]:
        source = iter(items)
        while chunk := list(itertools.islice(source, window)):
            prompts = [prompt_of(item) for item in chunk]
            planned = window_batches(prompts, batch_size)
            current = _Window(chunk, [None] * len(chunk), len(planned))
            open_windows.append(current)
            for positions in planned:
                yield (current, positions), [prompts[i] for i in positions]

    for (owner, positions), generations in pool.map(batches()):
        for position, generation in zip(positions, generations, strict=True):
            owner.generations[position] = generation
        owner.outstanding -= 1
        if on_batch is not None:
            on_batch(len(positions))
        # Batches come back in the order given, so the oldest window is the first to finish.
        while open_windows and open_windows[0].outstanding == 0:
            finished = open_windows.popleft()
            # A finished window has every generation.
            yield [
                (item, cast(Generation, done)) for item, done in zip(finished.items, finished.generations, strict=True)
            ]
