"""The prompts of ``rayft generate``, from the rows of a JSON Lines file (pure: no model, no Ray).

The file is read by the one reader of JSON Lines (:func:`rayft.data.read.rows.iter_json_lines`), a line at
a time. Every non-blank line becomes either a :class:`PromptRow` (its prompt, and the whole row, which the
output carries through) or a :class:`RejectedRow` with its line number, a reason code of the data plane's
(:data:`rayft.data.formats.REASONS`: the reader's ``bad_encoding``, ``bad_json``, ``duplicate_key``,
``row_too_large``, and ``missing_field``, ``empty_field``, ``wrong_type``, ``unknown_role`` for the
prompt), a detail and the line itself; no line is dropped without a trace. The prompt is the ``field``
column, or by default ``prompt`` (else ``messages``): a string is sent as it is, a list of
``{role, content}`` turns (or ShareGPT ``{from, value}``) goes through the chat template. A conversation
with tool use (a ``tools`` column of function schemas, assistant ``tool_calls``, ``tool`` results) is
checked as training checks it (:func:`rayft.data.tools.tool_conversation`: the same reject reasons) and
becomes a :class:`~rayft.generation.backend.ToolChat`, rendered with its tools as training renders them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rayft.data.formats import MESSAGE_COLUMNS, ROLE_ALIASES, TOOLS_COLUMN, BadRowError, parse_chat_turns
from rayft.data.read.rows import ReadRow
from rayft.data.tools import TOOL_ROLES, ToolUseError, normalize_tools, tool_conversation
from rayft.generation.backend import Message, Prompt, ToolChat

DEFAULT_FIELDS = ("prompt", "messages")
MAX_VALUE_CHARS = 2000
"""Longest excerpt of a rejected line kept in the rejects file."""


@dataclass(frozen=True)
class PromptRow:
    """A usable line: its number (from 1), its prompt, and the row as read."""

    line: int
    prompt: Prompt
    row: dict[str, Any]


@dataclass(frozen=True)
class RejectedRow:
    """A line that cannot be prompted, and why (``reason``: a key of :data:`rayft.data.formats.REASONS`)."""

    line: int
    reason: str
    detail: str
    value: str

    def to_dict(self) -> dict[str, Any]:
        """The rejects-file record."""
        return {"line": self.line, "reason": self.reason, "detail": self.detail, "value": self.value}


@dataclass(frozen=True)
class PromptFile:
    """Every line of an input file, sorted into usable rows and rejected ones."""

    rows: list[PromptRow] = field(default_factory=list)
    rejected: list[RejectedRow] = field(default_factory=list)

    def rejected_by_reason(self) -> dict[str, int]:
        """Reason code -> how many lines it rejected."""
        counts: dict[str, int] = {}
        for item in self.rejected:
            counts[item.reason] = counts.get(item.reason, 0) + 1
        return counts


class BadPromptError(Exception):
    """A row without a usable prompt; ``reason`` is a key of :data:`rayft.data.formats.REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def read_prompts(rows: Iterable[ReadRow], prompt_field: str | None = None) -> PromptFile:
    """Sort the rows of a JSON Lines file into prompt rows and rejected rows."""
    parsed = PromptFile()
    for item in iter_prompts(rows, prompt_field):
        if isinstance(item, PromptRow):
            parsed.rows.append(item)
        else:
            parsed.rejected.append(item)
    return parsed


def iter_prompts(rows: Iterable[ReadRow], prompt_field: str | None = None) -> Iterator[PromptRow | RejectedRow]:
    """Each row of a JSON Lines file, as it is read: a prompt row, or a rejected row (one the reader could not
    read keeps its reason; one without a usable prompt gets the reason it has none)."""
    for item in rows:
        value = _excerpt(item.text or "")
        if item.row is None:
            yield RejectedRow(item.line, item.reason, item.detail, value)
            continue
        try:
            prompt = row_prompt(item.row, prompt_field)
        except BadPromptError as bad:
            yield RejectedRow(item.line, bad.reason, bad.detail, value)
            continue
        yield PromptRow(item.line, prompt, item.row)


def row_prompt(row: dict[str, Any], prompt_field: str | None) -> Prompt:
    """The prompt of one row; raises :class:`BadPromptError` with the reason it has none."""
    name = prompt_field or next((f for f in DEFAULT_FIELDS if row.get(f) is not None), None)
    if name is None or row.get(name) is None:
        wanted = repr(prompt_field) if prompt_field else "'prompt' or 'messages'"
        fields = ", ".join(map(repr, row)) or "none"
        raise BadPromptError("missing_field", f"no {wanted} field (fields: {fields}); choose the column with --field")
    if uses_tools(row, row[name]):
        return tool_prompt(name, row[name], row.get(TOOLS_COLUMN))
    return to_prompt(name, row[name])


def uses_tools(row: dict[str, Any], value: Any) -> bool:
    """Whether a row is a tool-use conversation: it has tools, or a turn calls one or answers one."""
    if row.get(TOOLS_COLUMN) is not None:
        return True
    turns = value if isinstance(value, list) else []
    return any(isinstance(t, dict) and (t.get("tool_calls") or t.get("role") in TOOL_ROLES) for t in turns)


def tool_prompt(name: str, value: Any, tools: Any) -> ToolChat:
    """A tool-use conversation and its tools, checked as training checks them (the same reasons)."""
    try:
        schemas = normalize_tools(tools)
        messages = tool_conversation(parse_chat_turns(value, name), schemas)
    except (BadRowError, ToolUseError) as bad:
        raise BadPromptError(bad.reason, bad.detail) from None
    return ToolChat(messages, schemas)


def to_prompt(name: str, value: Any) -> Prompt:
    """A text prompt or a chat conversation from the value of column ``name`` (a conversation column,
    ``messages`` or ``conversations``, must hold a list of turns: a string there is the wrong type)."""
    if isinstance(value, str) and name in MESSAGE_COLUMNS:
        raise BadPromptError(
            "wrong_type",
            f"{name!r} is a string; give a list of chat turns ({{role, content}}) or the text as 'prompt'",
        )
    if isinstance(value, str):
        if not value.strip():
            raise BadPromptError("empty_field", f"{name!r} is an empty string")
        return value
    if not isinstance(value, list):
        raise BadPromptError(
            "wrong_type", f"{name!r} is a {type(value).__name__}; give a string or a list of chat turns"
        )
    if not value:
        raise BadPromptError("empty_field", f"{name!r} is an empty list of turns")
    return [to_message(name, index, turn) for index, turn in enumerate(value)]


def to_message(name: str, index: int, turn: Any) -> Message:
    """One chat turn as ``{role, content}``, from OpenAI (role/content) or ShareGPT (from/value) keys."""
    where = f"{name}[{index}]"
    if not isinstance(turn, dict):
        raise BadPromptError(
            "wrong_type", f"{where} is a {type(turn).__name__}; each turn is an object with role and content"
        )
    role = turn.get("role", turn.get("from"))
    content = turn.get("content", turn.get("value"))
    if not isinstance(role, str) or not isinstance(content, str):
        raise BadPromptError(
            "wrong_type", f"{where} needs a string role and a string content (got {json.dumps(turn)[:200]})"
        )
    if role not in ROLE_ALIASES:
        raise BadPromptError("unknown_role", f"{where} has role {role!r}; use system, user or assistant")
    return {"role": ROLE_ALIASES[role], "content": content}


def _excerpt(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "..."
