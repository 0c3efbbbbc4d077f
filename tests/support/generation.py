"""Prompts and a greedy run for checks that two generation paths give the same completions (the
KV-cache tests of the unit and gpu tiers); the lines of a prompts file as the data reader reads them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rayft.config.data import DEFAULT_MAX_ROW_BYTES
from rayft.data.read.rows import ReadRow, json_lines_of
from rayft.generation.backend import SamplingParams

if TYPE_CHECKING:
    from rayft.generation.hf import HFBackend


def json_lines(
    lines: list[bytes], *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, setting: str = "inference.max_row_bytes"
) -> Iterator[ReadRow]:
    """The rows of a JSON Lines file holding ``lines``, read by the one reader of JSON Lines."""
    return json_lines_of(io.BytesIO(b"".join(lines)), max_row_bytes, "in.jsonl", setting=setting)


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
