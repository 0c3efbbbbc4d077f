"""Tool use in chat data: a conversation's tool calls and tool results checked against the row's tools,
and rayft's default text format of tools for chat templates that have none of their own.

Pure Python (no tokenizer, no template engine): :mod:`rayft.data.formats` checks training rows with
:func:`tool_conversation`, :mod:`rayft.data.tokenize` renders them, and the server reads a model's
output back with :func:`parse_tool_calls`, so that training and serving share one format.

A conversation follows OpenAI's chat shape: an assistant turn may hold ``tool_calls``
(``[{"id", "type": "function", "function": {"name", "arguments"}}]``, ``arguments`` a JSON object or
its JSON text), a ``tool`` turn answers one of them (``tool_call_id``, ``content``), and the row's
``tools`` lists OpenAI function schemas (``{"type": "function", "function": {"name", "description",
"parameters"}}``, or the inner object alone). Calls come out with ``arguments`` as an object, which is
what chat templates expect.

The default format, for a template that does not render tools (see ``template_renders_tools`` in
:mod:`rayft.data.tokenize`):

- the tools, one JSON schema a line, inside ``<tools>``/``</tools>`` with a line on how to call them,
  go into the system message (after the row's own system prompt, or as the whole system message);
- an assistant call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one per call, each
  on its own line) after the assistant's text;
- the results of consecutive ``tool`` turns become one ``user`` turn, each result inside
  ``<tool_response>``/``</tool_response>`` (so templates that require user/assistant alternation work).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_REASONS = {
    "bad_tools": "the row's tools are not a list of function schemas, each with a name",
    "bad_tool_call": "an assistant tool call is malformed: no function name, or arguments that are not a JSON object",
    "orphan_tool_result": "a tool result answers no earlier call (no call before it, or an unknown tool_call_id)",
    "unknown_tool": "an assistant calls a tool that is not in the row's tools",
}
"""Reason code -> what it means, for rows whose tool use is wrong (merged into the data reasons)."""

TOOL_ROLES = ("tool", "ipython")  # ipython: Llama 3's name for the tool role
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOLS_HEADER = "You can call the following tools. Each is described by a JSON schema within <tools></tools>:\n<tools>\n"
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a tool, answer with one line per call, each a JSON object with the tool's name and "
    'arguments within <tool_call></tool_call>:\n<tool_call>{"name": <tool-name>, "arguments": <args-json-object>}'
    "</tool_call>\nEach tool's result comes back within <tool_response></tool_response>."
)
CLOSED_CALL_PATTERN = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
"""A complete call block (the server reads these: in a stream, a block not yet closed may still grow)."""
# A last block may be left open: generation that stops at the stop string ``</tool_call>`` leaves it out.
_BLOCK_PATTERN = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL)


class ToolUseError(Exception):
    """A conversation or a tool call that breaks the tool-use rules; ``reason`` is a key of ``TOOL_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool: its name, its arguments (a JSON object) and the call's id ('' when none)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_openai(self, *, arguments_as_text: bool = False) -> dict[str, Any]:
        """The call in OpenAI's shape; ``arguments_as_text`` gives the arguments as JSON text, as the API does."""
        arguments: Any = json.dumps(self.arguments, ensure_ascii=False) if arguments_as_text else self.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": arguments}}


def normalize_tools(value: Any) -> tuple[dict[str, Any], ...]:
    """A row's tools (a list, or its JSON text) as OpenAI function schemas; ToolUseError when malformed."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ToolUseError("bad_tools", f"tools is text that is not JSON ({exc.msg})") from None
    if not isinstance(value, list):
        raise ToolUseError("bad_tools", f"tools is a {type(value).__name__}, not a list of function schemas")
    return tuple(_tool_schema(index, item) for index, item in enumerate(value))


def _tool_schema(index: int, item: Any) -> dict[str, Any]:
    inner = item.get("function", item) if isinstance(item, dict) else None
    if not isinstance(inner, dict) or not isinstance(inner.get("name"), str) or not inner["name"].strip():
        raise ToolUseError("bad_tools", f"tools[{index}] is not a function schema with a name: {_short(item)}")
    return {"type": "function", "function": inner}


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The function names of OpenAI tool schemas (as :func:`normalize_tools` returns them)."""
    return [str(tool["function"]["name"]) for tool in tools]


def normalize_call(raw: Any, where: str) -> ToolCall:
    """One call of an assistant turn's ``tool_calls`` (OpenAI's shape, or the inner function object);
    ToolUseError naming ``where`` when it has no name or its arguments are not a JSON object."""
    function = raw.get("function", raw) if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise ToolUseError(
            "bad_tool_call",
            f'{where} is not a tool call: it must be a JSON object {{"name": ..., "arguments": {{...}}}}, '
            f"not {_short(raw)}",
        )
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolUseError("bad_tool_call", f"{where} has no function name: {_short(raw)}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolUseError(
                "bad_tool_call", f"{where} ({name}): arguments are not valid JSON ({exc.msg}): {_short(arguments)}"
            ) from None
    if not isinstance(arguments, dict):
        raise ToolUseError("bad_tool_call", f"{where} ({name}): arguments are a {type(arguments).__name__}, "
                                            "not a JSON object")  # fmt: skip
    call_id = raw.get("id") if isinstance(raw, dict) else None
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) else "")


def tool_conversation(
    messages: Sequence[tuple[str, str, Mapping[str, Any]]], tools: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """Check a conversation's tool use and return it as chat-template messages.

    ``messages`` are (role, content, turn) with the role already mapped (system/user/assistant/tool)
    and ``turn`` the raw turn. Every call must name a tool of ``tools`` (``unknown_tool``) and be well
    formed (``bad_tool_call``); every tool result must answer an earlier call of the conversation, by
    its ``tool_call_id`` when it gives one (``orphan_tool_result``). Raises :class:`ToolUseError`.
    """
    known = set(tool_names(tools))
    calls: dict[str, str] = {}  # call id -> tool name, for the results that name their call
    called = 0
    out: list[dict[str, Any]] = []
    for number, (role, content, turn) in enumerate(messages):
        if role == "tool":
            out.append(_tool_result(number, content, turn, calls, called))
            continue
        message: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and turn.get("tool_calls"):
            parsed = _calls(number, turn["tool_calls"], known)
            for index, call in enumerate(parsed):
                calls[call.id or f"call_{number}_{index}"] = call.name
            called += len(parsed)
            message["tool_calls"] = [call.to_openai() for call in parsed]
        out.append(message)
    return tuple(out)


def _calls(number: int, raw: Any, known: set[str]) -> list[ToolCall]:
    if not isinstance(raw, list):
        raise ToolUseError("bad_tool_call", f"turn {number}: tool_calls is a {type(raw).__name__}, not a list")
    parsed = [normalize_call(item, f"turn {number} tool_calls[{index}]") for index, item in enumerate(raw)]
    for call in parsed:
        if call.name not in known:
            offered = ", ".join(sorted(known)) or "none: the row has no tools"
            raise ToolUseError("unknown_tool", f"turn {number} calls {call.name!r}, not one of the row's tools "
                                               f"({offered})")  # fmt: skip
    return parsed


def _tool_result(
    number: int, content: str, turn: Mapping[str, Any], calls: dict[str, str], called: int
) -> dict[str, Any]:
    call_id = turn.get("tool_call_id")
    if not called:
        raise ToolUseError("orphan_tool_result", f"turn {number} is a tool result with no tool call before it")
    message: dict[str, Any] = {"role": "tool", "content": content}
    if call_id is not None:
        if call_id not in calls:
            raise ToolUseError("orphan_tool_result", f"turn {number} answers tool_call_id {call_id!r}, which no "
                                                     f"earlier call has (ids: {', '.join(calls)})")  # fmt: skip
        message["tool_call_id"] = call_id
        message["name"] = calls[call_id]
    return message


def with_object_arguments(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each tool call's ``arguments`` as a JSON object where they are given as JSON text
    (as OpenAI's API sends them): chat templates write the arguments with ``tojson``, which would quote
    the text. Arguments that are not valid JSON text stay as they are."""
    out = []
    for message in messages:
        copy = dict(message)
        if copy.get("tool_calls"):
            copy["tool_calls"] = [_object_arguments(call) for call in copy["tool_calls"]]
        out.append(copy)
    return out


def _object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def render_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the default format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls of a model's output in the default format, in order (ids ``call_0``, ``call_1``...).

    Each ``<tool_call>...</tool_call>`` block must hold a JSON object with a ``name`` and, optionally,
    ``arguments`` (an object, or its JSON text; ``parameters`` is read as well, as Llama 3 writes it);
    a block that does not raises :class:`ToolUseError` (``bad_tool_call``) naming it. Text outside the
    blocks is not a call (see :func:`split_tool_calls`).
    """
    calls = []
    for block in tool_call_blocks(text):
        if isinstance(block, ToolUseError):
            raise block
        calls.append(block)
    return calls


def tool_call_blocks(text: str) -> list[ToolCall | ToolUseError]:
    """Every call block of a model's output, in order: a :class:`ToolCall`, or the :class:`ToolUseError`
    that says why the block is not one (for callers that answer each bad block and go on, as an
    environment does). A last block left open (generation stopped at ``</tool_call>``) is read as closed."""
    blocks: list[ToolCall | ToolUseError] = []
    for index, match in enumerate(_BLOCK_PATTERN.finditer(text)):
        where = f"tool call {index + 1} of the output"
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            blocks.append(ToolUseError("bad_tool_call", f"{where} is not JSON ({exc.msg}): {_short(match.group(1))}"))
            continue
        if isinstance(body, dict) and "arguments" not in body and "parameters" in body:
            body = {**body, "arguments": body["parameters"]}
        try:
            call = normalize_call(body, where)
        except ToolUseError as exc:
            blocks.append(exc)
            continue
        blocks.append(ToolCall(call.name, call.arguments, f"call_{index}"))
    return blocks


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A model's output as (its text without the call blocks, stripped; the calls, see :func:`parse_tool_calls`)."""
    return _BLOCK_PATTERN.sub("", text).strip(), parse_tool_calls(text)


def tools_system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The default format's description of ``tools`` that goes into the system message."""
    lines = "\n".join(json.dumps(dict(tool), ensure_ascii=False) for tool in tools)
    return f"{TOOLS_HEADER}{lines}{TOOLS_FOOTER}"


def default_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """A tool conversation (as :func:`tool_conversation` returns it) as plain role/content messages in the
    default format, for a chat template that renders no tools (see the module docstring)."""
    out: list[dict[str, str]] = []
    after_result = False  # the last message out holds tool results: the next result joins it
    for message in messages:
        role, content = str(message["role"]), str(message.get("content") or "")
        if role == "assistant" and message.get("tool_calls"):
            blocks = [
                render_tool_call(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
            ]
            content = "\n".join([content, *blocks] if content else blocks)
        if role == "tool":
            result = f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"
            if after_result:
                out[-1]["content"] += "\n" + result  # consecutive results: one user turn
            else:
                out.append({"role": "user", "content": result})
            after_result = True
            continue
        after_result = False
        out.append({"role": role, "content": content})
    if tools:
        described = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
