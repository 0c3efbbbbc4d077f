"""The counters of one model replica's engine, for tests, operators and the server's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rayft.serving.prefix_cache import PrefixCacheStats


@dataclass
class EngineStats:
    """Counters of one replica, for tests and operators: loads, unloads, steps, rows in flight."""

    base_loads: int = 0
    adapter_loads: dict[str, int] = field(default_factory=dict)
    adapter_unloads: int = 0
    steps: int = 0
    rows_in_flight: int = 0
    waiting: int = 0
    cancelled: int = 0
    refused: int = 0
    largest_batch: int = 0
    joined_running_batch: int = 0  # requests prefilled while other rows were decoding
    mixed_steps: int = 0  # prefill steps that decoded the running rows in the same forward (serve.mixed_steps)
    # Where a request's time goes (sums in seconds and tokens; a reader takes differences over a window):
    prefill_steps: int = 0
    prefill_s: float = 0.0  # wall time of the prefill steps
    prefill_tokens: int = 0  # prompt tokens prefilled
    prefill_padding: int = 0  # pad positions the left-padded prefill batches computed besides them
    decode_steps: int = 0
    decode_s: float = 0.0  # wall time of the decoding steps
    decode_rows: int = 0  # rows decoded, over all decoding steps (their mean batch size times the steps)
    admitted: int = 0  # requests that joined a batch
    queued_s: float = 0.0  # their time in the waiting queue, from submission to the step that prefills them
    first_token_s: float = 0.0  # their time from submission to their first token handed to the replica
    # The prompt-prefix cache (serve.prefix_cache_tokens): prompt tokens looked up, those found (not prefilled),
    # requests that found a prefix, tokens held now, blocks evicted.
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_hit_requests: int = 0
    prefix_cached_tokens: int = 0
    prefix_evicted_blocks: int = 0

    def count_step(self, prefilled: list[int], submitted: list[float], rows: int, started: float, elapsed: float
                   ) -> None:  # fmt: skip
        """Add one step to the timing counters: ``prefilled`` holds the prompt tokens each request admitted at
        the step prefilled (none: a decoding step), ``submitted`` their submission times, ``rows`` the rows that
        got a token."""
        ended = started + elapsed
        if not prefilled:
            self.decode_steps, self.decode_s, self.decode_rows = (
                self.decode_steps + 1, self.decode_s + elapsed, self.decode_rows + rows)  # fmt: skip
            return
        self.mixed_steps += rows > len(prefilled)
        self.prefill_steps, self.prefill_s = self.prefill_steps + 1, self.prefill_s + elapsed
        self.prefill_tokens += sum(prefilled)
        self.prefill_padding += max(prefilled) * len(prefilled) - sum(prefilled)
        self.admitted += len(prefilled)
        self.queued_s += sum(started - at for at in submitted)
        self.first_token_s += sum(ended - at for at in submitted)

    def count_prefixes(self, cache: PrefixCacheStats) -> None:
        """Take the prompt-prefix cache's figures."""
        self.prefix_queried_tokens, self.prefix_hit_tokens, self.prefix_hit_requests = (
            cache.queried_tokens, cache.hit_tokens, cache.hit_requests)  # fmt: skip
        self.prefix_cached_tokens, self.prefix_evicted_blocks = cache.cached_tokens, cache.evicted_blocks
