"""Reading the prompts of ``rayft generate`` from JSON Lines (pure: no model, no Ray).

Every non-blank line becomes either a :class:`PromptRow` (its prompt, and the whole row, which
the output carries through) or a :class:`RejectedRow` with its line number, a reason code of
:data:`REASONS`, a detail and the line itself; no line is dropped without a trace. The prompt is
the ``field`` column, or by default ``prompt`` (else ``messages``): a string is sent as it is, a
list of ``{role, content}`` turns (or ShareGPT ``{from, value}``) goes through the chat template.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rayft.config.data import DEFAULT_MAX_ROW_BYTES
from rayft.data.formats import MESSAGE_COLUMNS, ROLE_ALIASES
from rayft.data.read.rows import DuplicateKeyError, unique_keys
from rayft.generation.backend import Message, Prompt
from rayft.lines import OversizedLine, describe_size

DEFAULT_FIELDS = ("prompt", "messages")
MAX_VALUE_CHARS = 2000
"""Longest excerpt of a rejected line kept in the rejects file."""

REASONS = {
    "not_utf8": "the line is not UTF-8 text",
    "not_json": "the line is not valid JSON",
    "not_object": "the line is JSON but not an object",
    "missing_field": "the row has no prompt field (or it is null)",
    "empty_field": "the prompt is empty",
    "wrong_type": "the prompt is neither a string nor a list of chat turns",
    "unknown_role": "a chat turn has a role that is not system/user/assistant",
    "duplicate_key": "a JSON object on the line repeats a key",
    "row_too_large": "the line is longer than inference.max_row_bytes (it was not read whole)",
}
"""Reason code -> what it means; the codes appear in the rejects file and the summary."""


@dataclass(frozen=True)
class PromptRow:
    """A usable line: its number (from 1), its prompt, and the row as read."""

    line: int
    prompt: Prompt
    row: dict[str, Any]


@dataclass(frozen=True)
class RejectedRow:
    """A line that cannot be prompted, and why."""

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
    """A line without a usable prompt; ``reason`` is a key of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def read_prompts(lines: Iterable[bytes | OversizedLine], prompt_field: str | None = None) -> PromptFile:
    """Sort the lines of a JSON Lines file (as bytes) into prompt rows and rejected rows."""
    parsed = PromptFile()
    for item in iter_prompts(lines, prompt_field):
        if isinstance(item, PromptRow):
            parsed.rows.append(item)
        else:
            parsed.rejected.append(item)
    return parsed


def iter_prompts(
    lines: Iterable[bytes | OversizedLine], prompt_field: str | None = None, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> Iterator[PromptRow | RejectedRow]:
    """Each non-blank line of a JSON Lines file (as bytes), as it is read: a prompt row or a rejected
    row. A UTF-8 byte order mark opening the first line is skipped; a line too long to read
    (:class:`~rayft.lines.OversizedLine`, over ``max_row_bytes``) is rejected with its size."""
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, OversizedLine):
            detail = (f"{describe_size(raw.size)}, above inference.max_row_bytes ({describe_size(max_row_bytes)}); "
                      "split the line or raise inference.max_row_bytes")  # fmt: skip
            yield RejectedRow(number, "row_too_large", detail, "")
            continue
        line = raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield RejectedRow(number, "not_utf8", str(exc), _excerpt(line.decode("utf-8", "replace")))
            continue
        try:
            row, prompt = parse_line(text, prompt_field)
        except BadPromptError as bad:
            yield RejectedRow(number, bad.reason, bad.detail, _excerpt(text))
            continue
        yield PromptRow(number, prompt, row)


def parse_line(text: str, prompt_field: str | None) -> tuple[dict[str, Any], Prompt]:
    """The row of one line and its prompt; raises :class:`BadPromptError` with the reason it has none."""
    try:
        row = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise BadPromptError("not_json", f"{exc.msg} at column {exc.colno}") from None
    except DuplicateKeyError as exc:
        raise BadPromptError("duplicate_key", f"key {exc.key!r} appears twice in one object; keep one") from None
    if not isinstance(row, dict):
        raise BadPromptError("not_object", f"a JSON {type(row).__name__}, not an object")
    name = prompt_field or next((f for f in DEFAULT_FIELDS if row.get(f) is not None), None)
    if name is None or row.get(name) is None:
        wanted = repr(prompt_field) if prompt_field else "'prompt' or 'messages'"
        fields = ", ".join(map(repr, row)) or "none"
        raise BadPromptError("missing_field", f"no {wanted} field (fields: {fields}); choose the column with --field")
    return row, to_prompt(name, row[name])


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
