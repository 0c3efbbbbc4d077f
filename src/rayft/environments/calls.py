"""Tool calls read from a model's turn: the default text format, ``<tool_call>{json}</tool_call>``.

A call's JSON is ``{"name": ..., "arguments": {...}}`` (``arguments`` may also be JSON text, as in
OpenAI's messages). :func:`parse_tool_calls` is the one place the environments read the format, so that
the rendering of training data and the environments agree on it; a block that does not parse is kept as
a :class:`BadCall`, answered to the model with its reason and counted, never skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class BadCall:
    """A call block that is not a call; ``reason`` is answered to the model."""

    text: str
    reason: str
    id: str = ""


def parse_tool_calls(text: str) -> list[ToolCall | BadCall]:
    """The calls in a model's turn, in order; empty when the turn is a final answer."""
    calls: list[ToolCall | BadCall] = []
    for index, match in enumerate(_BLOCK.finditer(text)):
        calls.append(_parse_one(match.group(1).strip(), f"call_{index}"))
    return calls


def _parse_one(body: str, call_id: str) -> ToolCall | BadCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return BadCall(body, f"the tool call is not JSON ({exc.msg} at character {exc.pos})", call_id)
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return BadCall(body, 'a tool call must be a JSON object {"name": ..., "arguments": {...}}', call_id)
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return BadCall(body, "the call's arguments are text that is not a JSON object", call_id)
    if not isinstance(arguments, dict):
        return BadCall(body, f"the call's arguments must be a JSON object, not {type(arguments).__name__}", call_id)
    return ToolCall(data["name"], arguments, call_id)
