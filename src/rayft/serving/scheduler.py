"""Which waiting requests join a replica's running batch, and when its queue is full (pure: no torch).

A replica decodes its running rows one token per step (:mod:`rayft.serving.batch`). Before each step
:func:`plan_admission` takes requests from the head of the waiting queue, in arrival order, while
the batch has a free row, the KV budget has room for the request's whole sequence (prompt and
completion, reserved up front so that a running row never has to be evicted) and the step's
prefill stays within its token budget (``serve.max_prefill_tokens``, beyond the first request). A
request that does not fit waits at the head: later, smaller requests do not overtake it, so no
request starves. Where the batch prefills in its decoding steps (mixed steps), every step may admit;
else, while rows decode, prefill steps and decoding steps alternate (:func:`prefill_turn`).

Why a small prefill budget (64 tokens by default, about one chat prompt) and the alternation: rows that
join in one step, or in prefill steps with no decoding step between them, have decoded as many tokens
at every step, so with equal ``max_tokens`` they end at the same step, and the next requests of
clients that wait for those answers arrive together: a wave whose last request waits for the whole
wave's prefill. One request per prefill step with a decoding step between two prefill steps puts each
row of a burst one step apart, so their ends, and the requests that follow them, stay spread over
steps, and each new request waits for one step in progress and its own prefill. Without mixed steps
the cost is one forward's fixed cost per request instead of per group (``docs/performance.md`` has the
figures); a mixed step pays none, since it decodes the running rows in the same forward. The
waiting queue itself is bounded (:func:`queue_full`); a request beyond it is refused with a retry hint
(:func:`retry_after_s`), never left to wait unbounded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The bounds of one replica's batch: rows, KV tokens, queued requests and prefill tokens per step."""

    max_rows: int
    kv_tokens: int
    max_queued: int
    max_prefill_tokens: int


@dataclass(frozen=True)
class Need:
    """What one request takes: its prompt tokens, and its prompt plus completion limit in KV tokens; ``cached``
    of its prompt tokens come from a cached prefix (they take KV tokens, but no prefill)."""

    prompt_tokens: int
    max_tokens: int
    cached: int = 0

    @property
    def kv_tokens(self) -> int:
        """KV cache positions the request reserves while it runs."""
        return self.prompt_tokens + self.max_tokens


def plan_admission(waiting: Sequence[Need], running: Sequence[Need], limits: Limits) -> int:
    """How many requests at the head of ``waiting`` join the batch now (in order, none skipped).

    The first request always joins an empty batch if it fits the KV budget alone, whatever its
    prompt's length against the prefill bound, so that a long prompt is never stuck.
    """
    rows, reserved, prefill = len(running), sum(n.kv_tokens for n in running), 0
    admitted = 0
    for need in waiting:
        if rows >= limits.max_rows or reserved + need.kv_tokens > limits.kv_tokens:
            break
        if admitted and prefill + need.prompt_tokens - need.cached > limits.max_prefill_tokens:
            break
        rows, reserved, admitted = rows + 1, reserved + need.kv_tokens, admitted + 1
        prefill += need.prompt_tokens - need.cached
    return admitted


def prefill_turn(prefilled_last_step: bool, running_rows: int, *, mixed: bool = False) -> bool:
    """Whether this step may prefill waiting requests: always where the batch runs mixed steps (every step
    decodes the running rows, prefill or not); else not right after a prefill step while rows are running.

    Prefilling a burst chunk after chunk before any row decodes again would make every row of the
    burst end at the same step (each has decoded as many tokens), and the next requests of clients
    that wait for those answers would arrive together: one wave after another, each new request
    waiting for its wave's whole prefill. One decoding step between two prefill steps keeps the
    earlier chunks a token ahead per chunk, at the cost of one decoding step of waiting for the later ones.
    """
    return mixed or not (prefilled_last_step and running_rows > 0)


def queue_full(waiting: int, limits: Limits) -> bool:
    """Whether a new request is refused: ``waiting`` requests queue already, as many as allowed."""
    return waiting >= limits.max_queued


def retry_after_s(remaining_tokens: Sequence[int], step_s: float) -> int:
    """Seconds a refused client waits before it retries: until the running row closest to its end
    has finished (its remaining tokens times the recent time of one step), at least one second."""
    if not remaining_tokens:
        return 1
    return max(1, math.ceil(min(remaining_tokens) * max(step_s, 0.0)))
