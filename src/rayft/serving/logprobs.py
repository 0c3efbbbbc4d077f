"""Log-probabilities of generated tokens, as a replica hands them to the router (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, id and log-probability, and the most likely alternatives."""

    token: str
    token_id: int
    logprob: float
    top: list[tuple[str, float]]
