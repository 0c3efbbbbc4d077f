"""Token log-probabilities of ``rayft serve``, and their two OpenAI shapes (pure: no model, no Ray).

A :class:`TokenLogprob` is one token as the model saw or chose it: its text, its id, its
log-probability and the most likely alternatives at its position. The engine attaches them to the
text it streams (``logprobs`` / ``top_logprobs`` of a request) and the scorer returns them for a
prompt (``echo``); :func:`chat_logprobs` and :func:`completion_logprobs` render them as OpenAI's chat
``logprobs.content`` and completions ``logprobs`` objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenLogprob:
    """One token and its log-probability under the model.

    Attributes:
        token: The token's text (the token decoded on its own).
        token_id: The token's id in the model's vocabulary.
        logprob: Its natural-log probability given the tokens before it; None for a prompt's first
            token, which nothing precedes.
        top: The most likely tokens at its position, as ``(text, logprob)``, most likely first.
    """

    token: str
    token_id: int
    logprob: float | None
    top: list[tuple[str, float]]


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: ``{"content": [...]}``, one entry per token."""
    content = [
        {
            "token": t.token,
            "logprob": t.logprob,
            "bytes": _token_bytes(t.token),
            "top_logprobs": [{"token": s, "logprob": p, "bytes": _token_bytes(s)} for s, p in t.top],
        }
        for t in tokens
    ]
    return {"content": content}


def _by_text(top: list[tuple[str, float]]) -> dict[str, float]:
    """The legacy format keys alternatives by their text, so two tokens that decode alike (two byte
    pieces of one character both read as U+FFFD) share a key; the likelier one keeps it, as the
    alternatives come most likely first."""
    alternatives: dict[str, float] = {}
    for text, logprob in top:
        alternatives.setdefault(text, logprob)
    return alternatives


def completion_logprobs(tokens: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A text completion choice's ``logprobs``: tokens, their log-probabilities, the alternatives
    (None where none were computed: a prompt's first token) and each token's character offset in
    the choice's text, starting at ``offset``."""
    offsets: list[int] = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [_by_text(t.top) if t.logprob is not None else None for t in tokens],
        "text_offset": offsets,
    }
