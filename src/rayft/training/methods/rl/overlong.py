"""Completions cut at ``train.rl.max_new_tokens`` before their end of sequence: DAPO's soft overlong
punishment (``train.rl.overlong_buffer``) and overlong filtering (``train.rl.mask_truncated``).

A truncated completion's reward judges text that never ended; filtering keeps it out of the loss (its tokens
masked, as TRL's ``mask_truncated_completions``), while its reward still counts in its group's statistics.
The soft punishment instead lowers the reward of long completions linearly over the last ``overlong_buffer``
tokens before the limit, so length is discouraged before it turns into truncation.
"""

from __future__ import annotations

from collections.abc import Sequence


def truncated(token_ids: Sequence[Sequence[int]], eos_ids: Sequence[int]) -> list[bool]:
    """Whether each completion was cut before its end of sequence (it does not end with one: the sampler cuts
    a completion after its first end-of-sequence token, so only a completion that hit the limit lacks one)."""
    return [not ids or ids[-1] not in eos_ids for ids in token_ids]


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment of a completion of ``length`` tokens: 0 up to ``max_new_tokens -
    buffer``, then falling linearly to ``-factor`` at ``max_new_tokens`` (verl's ``overlong_buffer``)."""
    exceeded = length - (max_new_tokens - buffer)
    return min(-exceeded / buffer * factor, 0.0)


def shaped_rewards(
    totals: Sequence[float], token_ids: Sequence[Sequence[int]], *, max_new_tokens: int, buffer: int | None,
    factor: float,
) -> list[float]:  # fmt: skip
    """Each completion's total reward plus its overlong punishment (the totals as they are without a buffer)."""
    if buffer is None:
        return list(totals)
    return [total + overlong_penalty(len(ids), max_new_tokens, buffer, factor)
            for total, ids in zip(totals, token_ids, strict=True)]  # fmt: skip
