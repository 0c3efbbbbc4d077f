"""Tool calls in ``rayft serve``: the tools rendered into the prompt, and the model's calls read back (pure).

A chat template that renders tools itself (it reads ``tools`` and the messages' ``tool_calls``, as
Qwen2.5's, Llama 3.1's and Hermes' do) gets them through ``apply_chat_template(..., tools=...)``; a
template that does not gets rayft's default format: the tools as JSON schemas in the system message,
each assistant call written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, and tool
results as a user turn inside ``<tool_response>`` tags, the format rayft's tool-use training data is
rendered in. The model's output is read back in that format (which Qwen2.5's and Hermes' templates
use as well): :func:`split_calls` for a whole answer, :class:`CallStream` for a streamed one, whose
text before a call streams as content and whose calls come out whole, one delta each.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayft.data.tokenize import template_renders_tools
from rayft.data.tools import (
    CLOSED_CALL_PATTERN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolUseError,
    default_messages,
    normalize_call,
    with_object_arguments,
)

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "Call", "CallStream", "split_calls", "tool_messages"]


@dataclass(frozen=True)
class Call:
    """One tool call of the model's output: its id (``call_...``), name and arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """The call in OpenAI's shape (``message.tool_calls[]``)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def tool_messages(messages: list[Any], tools: Sequence[Mapping[str, Any]], template: str | None
                  ) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
    """The messages to render and the template's extra arguments: as they are without tools or tool turns;
    with ``tools=`` where the template renders tools; else in the default format (the one training data
    is rendered in, :mod:`rayft.data.tools`)."""
    if not tools and not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        return messages, {}
    if template and template_renders_tools(template):
        return with_object_arguments(messages), ({"tools": [dict(t) for t in tools]} if tools else {})
    return default_messages(with_object_arguments(messages), tools), {}


def parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of one call block's body; None when it is not a call. The server is
    tolerant where training data is strict: a block that is not a call stays in the answer's text."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if isinstance(value, dict) and "arguments" not in value and "parameters" in value:
        value = {**value, "arguments": value["parameters"]}  # Llama 3 writes ``parameters``
    try:
        call = normalize_call(value, "the call")
    except ToolUseError:
        return None
    return call.name, json.dumps(call.arguments, ensure_ascii=False)


def new_call_id() -> str:
    """A call id in OpenAI's form."""
    return f"call_{secrets.token_hex(12)}"


def split_calls(text: str, allowed: set[str] | None = None) -> tuple[str | None, list[Call]]:
    """A whole answer as (its text outside the calls, or None when it is empty; its calls). A block that is
    not a valid call, or calls a tool not in ``allowed``, stays in the text, as the model wrote it."""
    calls: list[Call] = []
    kept: list[str] = []
    last = 0
    for match in CLOSED_CALL_PATTERN.finditer(text):
        parsed = parse_call(match.group(1))
        if parsed is None or (allowed is not None and parsed[0] not in allowed):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(Call(new_call_id(), *parsed))
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return content or None, calls


class CallStream:
    """Reads a streamed answer: text outside calls as content pieces, each complete call as a :class:`Call`.

    Text that may be the start of ``<tool_call>`` is held back until it is known not to be; a call is
    handed on once its closing tag arrives (and stays text if it is not a valid call of an allowed tool);
    :meth:`flush` hands on what is held at the end (an unclosed call, cut by ``max_tokens``, as text).
    """

    def __init__(self, allowed: set[str] | None = None) -> None:
        self.allowed, self.buffer, self.calls = allowed, "", 0

    def feed(self, text: str) -> list[str | Call]:
        """The content pieces and calls that ``text`` completes, in order."""
        self.buffer += text
        out: list[str | Call] = []
        while self.buffer:
            start = self.buffer.find(TOOL_CALL_OPEN)
            if start < 0:
                keep = _partial_tag(self.buffer)
                piece, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
                out += [piece] if piece else []
                break
            if start:
                out.append(self.buffer[:start])
                self.buffer = self.buffer[start:]
            end = self.buffer.find(TOOL_CALL_CLOSE)
            if end < 0:
                break
            block, self.buffer = self.buffer[: end + len(TOOL_CALL_CLOSE)], self.buffer[end + len(TOOL_CALL_CLOSE) :]
            parsed = parse_call(block[len(TOOL_CALL_OPEN) : end])
            if parsed is None or (self.allowed is not None and parsed[0] not in self.allowed):
                out.append(block)
                continue
            self.calls += 1
            out.append(Call(new_call_id(), *parsed))
        return out

    def flush(self) -> list[str | Call]:
        """What is held back at the end of the answer, as text."""
        rest, self.buffer = self.buffer, ""
        return [rest] if rest else []


def _partial_tag(text: str) -> int:
    """How many characters at the end of ``text`` could begin ``<tool_call>``."""
    for size in range(min(len(text), len(TOOL_CALL_OPEN) - 1), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
