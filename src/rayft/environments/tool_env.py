"""The tools environment: the model calls Python functions by writing tool calls, and reads their results.

Each model turn is read for ``<tool_call>`` blocks (:func:`rayft.environments.calls.parse_tool_calls`).
A turn without one is the final answer: the episode ends and the reward function scores it. A turn
with calls is answered with one ``tool`` message per call, in order. Whatever the model does wrong (a
call that is not JSON, an unknown tool, bad arguments, a call past the episode's limit) and whatever
a tool does wrong (raises, hangs past its timeout) is answered with an ``Error: ...`` message the model
reads, counted in the episode's figures, and the episode goes on. The episode is cut, with reward 0,
when its turns or tokens run out. A reward function that raises scores the episode 0 and says why in
``info["reward_error"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayft.environments.calls import BadCall, ToolCall, parse_tool_calls
from rayft.environments.episode import (
    EpisodeLimits,
    EpisodeStats,
    Message,
    Row,
    StepResult,
    TokenCounter,
    approximate_tokens,
)
from rayft.environments.tools import Tool, call_tool
from rayft.errors import DataError, RayftError

RewardOfAnswer = Callable[[str, Row], float]
"""``reward(final_answer, row) -> float``: the score of the episode's last turn (the row holds its reference)."""
BAD_CALL = "<malformed>"
"""The name a call that could not be read is counted under."""
UNKNOWN_TOOL = "<unknown>"
"""The name a call of a tool that does not exist is counted under (not the model's text: it may be anything)."""


class ToolsEnvironment:
    """An environment of tools; one episode at a time (make one environment per concurrent episode)."""

    def __init__(
        self, tools: Sequence[Tool], *, reward: RewardOfAnswer | None = None, limits: EpisodeLimits | None = None,
        count_tokens: TokenCounter = approximate_tokens,
    ) -> None:  # fmt: skip
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise RayftError(f"tool names must be unique; got {names}")
        self.tools = {tool.name: tool for tool in tools}
        self.limits = limits or EpisodeLimits()
        self._reward = reward
        self._count = count_tokens
        self._row: Row = {}
        self._stats = EpisodeStats()
        self._done = True

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' OpenAI function schemas, for the chat template's ``tools``."""
        return [tool.schema for tool in self.tools.values()]

    @property
    def stats(self) -> EpisodeStats:
        """The current (or last) episode's figures."""
        return self._stats

    def reset(self, row: Row) -> list[Message]:
        """The row's ``messages``, or its ``prompt`` as one user message."""
        if isinstance(row.get("messages"), list):
            messages: list[Message] = [dict(m) for m in row["messages"]]
        elif isinstance(row.get("prompt"), str):
            messages = [{"role": "user", "content": row["prompt"]}]
        else:
            raise DataError(f"an episode's row needs 'messages' (a list) or 'prompt' (text); its keys: {sorted(row)}")
        self._row, self._stats, self._done = row, EpisodeStats(), False
        self._stats.tokens = sum(self._count(str(m.get("content") or "")) for m in messages)
        return messages

    def step(self, model_turn: str) -> StepResult:
        """Answer the model's turn: run its tool calls, or score its final answer."""
        if self._done:
            raise RayftError("step() was called on an episode that has ended (or never started); call reset(row)")
        stats = self._stats
        stats.turns += 1
        stats.tokens += self._count(model_turn)
        calls = parse_tool_calls(model_turn)
        if not calls:
            return self._finish(model_turn)
        if stats.tokens > self.limits.max_tokens:
            return self._end(0.0, truncated="tokens")
        messages = [self._answer(call) for call in calls]
        stats.tokens += sum(self._count(m["content"]) for m in messages)
        if stats.turns >= self.limits.max_turns:
            return self._end(0.0, truncated="turns")
        if stats.tokens > self.limits.max_tokens:
            return self._end(0.0, truncated="tokens")
        return StepResult(messages, 0.0, False, stats.as_info())

    def _end(self, reward: float, truncated: str | None = None, reward_error: str | None = None) -> StepResult:
        self._done = True
        self._stats.truncated = truncated
        info = self._stats.as_info() | ({"reward_error": reward_error} if reward_error else {})
        return StepResult([], reward, True, info)

    def _finish(self, answer: str) -> StepResult:
        """Score the final answer; a reward function that fails scores 0, said in ``info['reward_error']``."""
        if self._reward is None:
            return self._end(0.0)
        try:
            return self._end(float(self._reward(answer, self._row)))
        except Exception as exc:  # a user's reward: the episode's failure, not the run's
            return self._end(0.0, reward_error=f"{type(exc).__name__}: {exc}")

    def _answer(self, call: ToolCall | BadCall) -> Message:
        """The tool message that answers one call; every failure is the message's text, and counted."""
        if isinstance(call, BadCall):
            self._stats.record(BAD_CALL, "error")
            return _tool_message(call.id, BAD_CALL, f"Error: {call.reason}")
        tool = self.tools.get(call.name)
        if tool is None:
            self._stats.record(UNKNOWN_TOOL, "error")
            return _tool_message(call.id, call.name, f"Error: no tool named {call.name!r}; the tools are "
                                                     f"{', '.join(self.tools) or 'none'}")  # fmt: skip
        if sum(self._stats.calls.values()) >= self.limits.max_tool_calls:
            self._stats.record(tool.name, "error")
            return _tool_message(call.id, tool.name, f"Error: this episode's {self.limits.max_tool_calls} tool calls "
                                                     "are used up; answer without tools")  # fmt: skip
        outcome = call_tool(tool, call.arguments, self._row, self.limits.tool_timeout_s)
        self._stats.record(tool.name, outcome.status)
        return _tool_message(call.id, tool.name, outcome.text)


def _tool_message(call_id: str, name: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
