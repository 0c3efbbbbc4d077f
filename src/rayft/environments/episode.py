"""The environment protocol of multi-turn episodes, their limits and their figures.

An episode starts from a data row (:meth:`Environment.reset` gives the first messages), then alternates:
the model writes a turn, :meth:`Environment.step` answers with the messages that follow it (tool
results), a reward, and whether the episode ended. A rollout loop, an evaluation or a test drives it the
same way; the environment owns what the turn means (which tools ran, what they said, when it is over).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]
"""A chat message in OpenAI's shape: ``role``, ``content``, and for tool results ``tool_call_id`` and ``name``."""
Row = Mapping[str, Any]


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one model turn."""

    messages: list[Message]
    """What follows the turn in the conversation (tool results); empty when the episode ended."""
    reward: float
    """The episode's reward when it ended (0 before)."""
    done: bool
    info: dict[str, Any]
    """The episode's figures so far (:meth:`EpisodeStats.as_info`)."""


@runtime_checkable
class Environment(Protocol):
    """What an environment provides; a user's class named ``package.module:Class`` provides the same."""

    def reset(self, row: Row) -> list[Message]:
        """Start an episode from a data row; the messages the model answers first."""
        ...

    def step(self, model_turn: str) -> StepResult:
        """Take the model's turn (its text); the messages that follow, the reward, and whether it is over."""
        ...


@dataclass(frozen=True)
class EpisodeLimits:
    """What one episode may use; past a limit the episode ends (turns, tokens) or the call is refused."""

    max_turns: int = 8
    max_tool_calls: int = 16
    max_tokens: int = 4096
    tool_timeout_s: float = 10.0


def approximate_tokens(text: str) -> int:
    """A tokenizer-free count (words and punctuation runs): the default where no tokenizer is given."""
    return len(text.split()) + sum(not c.isalnum() and not c.isspace() for c in text) // 2


TokenCounter = Callable[[str], int]


@dataclass
class EpisodeStats:
    """What an episode did: turns, tool calls, errors and timeouts per tool, tokens, how it ended."""

    turns: int = 0
    tokens: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    timeouts: Counter[str] = field(default_factory=Counter)
    truncated: str | None = None
    """Why the episode was cut (``turns``, ``tokens``), or None when the model ended it."""

    def record(self, tool: str, status: str) -> None:
        """Count one call of ``tool`` that ended with ``status`` (ok, error, timeout)."""
        self.calls[tool] += 1
        if status == "error":
            self.errors[tool] += 1
        elif status == "timeout":
            self.timeouts[tool] += 1

    def as_info(self) -> dict[str, Any]:
        """The figures as plain values, for logs and metrics."""
        return {
            "turns": self.turns, "tokens": self.tokens, "tool_calls": sum(self.calls.values()),
            "tool_calls_by_tool": dict(self.calls), "tool_errors": dict(self.errors),
            "tool_timeouts": dict(self.timeouts), "truncated": self.truncated,
        }  # fmt: skip
