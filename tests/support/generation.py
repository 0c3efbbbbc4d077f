"""Prompts and a greedy run for checks that two generation paths give the same completions (the
KV-cache tests of the unit and gpu tiers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayft.generation.backend import SamplingParams

if TYPE_CHECKING:
    from rayft.generation.hf import HFBackend

MIXED_PROMPTS = [
    "1 2",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9",
    "SELECT name",
    "A baker has 12 apples and buys 7 more. How many apples does the baker have?",
    "instruction input output",
]
"""Five prompts of different lengths: batches of two pad them, and the last batch is short."""


def greedy_completions(backend: HFBackend, max_new_tokens: int = 12) -> list[tuple[str, int, str]]:
    """Text, generated-token count and finish reason of each of :data:`MIXED_PROMPTS`, greedy."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    return [(g.text, g.num_generated_tokens, g.finish_reason) for g in backend.generate(MIXED_PROMPTS, params)]
