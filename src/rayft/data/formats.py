"""Turning a raw dataset row into an :class:`Example`: chat messages, or a raw prompt and response.

Pure Python, no tokenizer: :mod:`rayft.data.tokenize` renders and tokenizes what this module
returns. A row that cannot become an example raises :class:`BadRowError` with a stable reason code
(see ``REASONS``), which the preparation step reports per row and counts.

Formats (``DatasetConfig.format``):

- ``template``: ``input_template`` / ``output_template`` filled from the row's columns.
- ``alpaca``: ``instruction``, optional ``input``, ``output``.
- ``messages``: a list of turns, OpenAI (``role``/``content``) or ShareGPT (``from``/``value``);
  loss on every assistant turn. With tool use (OpenAI's assistant ``tool_calls``, ``tool`` turns and
  the row's ``tools`` column; see :mod:`rayft.data.tools`) the assistant's calls are trained too.
- ``prompt_completion``: ``prompt`` and ``completion``.
- ``text``: ``text`` only, every token trained (continued pre-training).
- ``auto``: detected from the columns by :func:`detect_format`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayft.config.data import DatasetConfig
from rayft.data.tools import (
    TOOL_REASONS,
    TOOL_ROLES,
    ToolUseError,
    default_messages,
    normalize_tools,
    tool_conversation,
)
from rayft.errors import DataError

REASONS = {
    "missing_field": "a field the format needs is missing or null",
    "empty_field": "a field the format needs is empty",
    "wrong_type": "a field holds a value of the wrong type",
    "no_assistant_turn": "a conversation has no assistant turn to train on",
    "unknown_role": "a conversation turn has a role that is not system/user/assistant (or tool, in a messages row)",
    "over_length": "the example is longer than max_seq_length (overlong: drop)",
    "all_labels_masked": "no token is left to train on (often: truncation cut the whole response)",
    "bad_encoding": "a line or source file is not valid UTF-8 text (see its detail for the first bad byte)",
    "bad_json": "a line of a JSON Lines file (or an item of a JSON list) is not a JSON object",
    "duplicate_key": "a JSON object repeats a key (which value is meant is unknown)",
    "row_too_large": "a row is larger than the dataset's max_row_bytes (its detail gives the size)",
    "identical_responses": "a preference pair's chosen and rejected responses are the same text",
    "no_shared_prompt": "a preference pair's chosen and rejected conversations share no prompt turns",
    "missing_row_column": "a column carried with each prompt to the rewards (train.rl) is missing or null",
    "template_error": "the chat template refuses the conversation (its own error, e.g. roles that do not alternate)",
    **TOOL_REASONS,
}
"""Reason code -> what it means; the codes appear in rejected.jsonl and in the stats."""

# Set on the row of a source file that could not be decoded (DatasetConfig.files); the row is rejected.
ENCODING_ERROR_COLUMN = "encoding_error"
# The only column of a row that the reader could not read (a line that is not JSON, not UTF-8, not an
# object): [reason, detail]. The row stays in the plan so that it is reported and counted like any other.
UNREADABLE_COLUMN = "_rayft_unreadable"
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
MESSAGE_COLUMNS = ("messages", "conversations")
TOOLS_COLUMN = "tools"  # a messages row's tool schemas (optional; field_mapping may name another column)
PROMPT_ALIASES = ("prompt", "question", "query")
COMPLETION_ALIASES = ("completion", "answer", "response")
PREFERENCE_COLUMNS = frozenset({"chosen", "rejected"})  # a prompt column is optional (see rayft.data.preference)
ALPACA_RAW = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n"


class BadRowError(Exception):
    """A row that cannot become a training example; ``reason`` is a key of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Example:
    """A row ready to render: chat ``messages`` (role, content), or a raw ``prompt`` + ``response``.

    With messages, the tokenizer's chat template renders the text and assistant turns are trained;
    otherwise the text is ``prompt + response`` and the response (plus EOS) is trained. A conversation
    with tool use also keeps its OpenAI-shaped messages (``chat``, with ``tool_calls`` and ``tool``
    turns) and its ``tools``, for a chat template that renders tools; ``messages`` is then the same
    conversation in rayft's default tool format (:func:`rayft.data.tools.default_messages`), for one
    that does not.
    """

    messages: tuple[tuple[str, str], ...] | None = None
    prompt: str = ""
    response: str = ""
    chat: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ResolvedFormat:
    """A dataset's format after ``auto`` detection, with the column each format field is read from."""

    format: str
    columns: dict[str, str]
    detected: bool
    # Columns that hold text in most rows of a JSON source: a number there is a wrong_type row, not text.
    text_columns: frozenset[str] = frozenset()

    def describe(self) -> str:
        """A one-line description for logs and stats, e.g. ``prompt_completion (detected: prompt=question)``."""
        mapping = ", ".join(f"{k}={v}" for k, v in sorted(self.columns.items()))
        how = "detected from the columns" if self.detected else "from the config"
        return f"{self.format} ({how}{': ' + mapping if mapping else ''})"


def template_fields(ds: DatasetConfig) -> list[str]:
    """The placeholder names of a dataset's input and output templates, in order of appearance."""
    names: list[str] = []
    for template in (ds.input_template or "", ds.output_template or ""):
        for _, name, _, _ in string.Formatter().parse(template):
            if name is not None and name not in names:
                if not name.isidentifier():
                    raise DataError(
                        f"dataset {ds.path!r}: template placeholder {{{name}}} is not a plain name; use "
                        "{column} placeholders and map them with field_mapping"
                    )
                names.append(name)
    return names


def resolve_format(ds: DatasetConfig, columns: Sequence[str], empty: Collection[str] = ()) -> ResolvedFormat:
    """Detect the format when ``auto`` and check that the columns it needs exist (else DataError).

    ``empty`` names the columns that hold no value in any row (an SDG output's unused ``prompt``): detection
    and the aliases pass over them, so that a table with an empty ``prompt`` and a filled ``question`` reads
    its questions; when only empty columns fit a format, detection falls back to every column."""
    mapping = dict(ds.field_mapping)
    fmt: str = ds.format
    detected = False
    filled = [c for c in columns if c not in empty]
    if fmt == "auto":
        fmt, detected = _detect_filled(columns, filled, mapping), True
    fields = _required_fields(ds, fmt, filled if fmt == "prompt_completion" else columns, mapping)
    resolved = {name: mapping.get(name, name) for name in fields}
    missing = sorted(c for c in resolved.values() if c not in columns)
    if missing:
        raise DataError(
            f"dataset {ds.path!r} (format {fmt!r}): column(s) {missing} not found; the columns are "
            f"{sorted(columns)}. Map them with field_mapping (e.g. field_mapping={{{fields[0]}: <column>}}) "
            "or choose another format"
        )
    optional = {"input": mapping.get("input", "input")} if fmt == "alpaca" else {}
    if fmt == "messages":
        optional = {"tools": mapping.get("tools", TOOLS_COLUMN)}
    resolved.update({k: v for k, v in optional.items() if v in columns})
    return ResolvedFormat(fmt, resolved, detected)


def _detect_filled(columns: Sequence[str], filled: Sequence[str], mapping: Mapping[str, str]) -> str:
    """The format the filled columns suggest, else the one every column suggests (else DataError)."""
    try:
        return detect_format(filled, mapping)
    except DataError:
        return detect_format(columns, mapping)


def detect_format(columns: Sequence[str], mapping: Mapping[str, str]) -> str:
    """The format a table's columns (and the field mapping) suggest; DataError when none fits."""
    cols = set(columns) | set(mapping)
    if cols >= PREFERENCE_COLUMNS:  # before messages: UltraFeedback rows carry a messages column too
        return "preference"
    if cols & set(MESSAGE_COLUMNS):
        return "messages"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if cols & set(PROMPT_ALIASES) and cols & set(COMPLETION_ALIASES):
        return "prompt_completion"
    if "text" in cols:
        return "text"
    raise DataError(
        f"cannot detect the dataset format from the columns {sorted(columns)}: expected 'messages' or "
        "'conversations' (chat), instruction+output (alpaca), prompt+completion or question+answer, text, or "
        "chosen+rejected (preference pairs). "
        "Set format and field_mapping in the dataset's config"
    )


def _required_fields(ds: DatasetConfig, fmt: str, columns: Sequence[str], mapping: dict[str, str]) -> list[str]:
    """Field names the format reads; aliases (question/answer, conversations) fill the mapping."""
    if fmt == "template":
        return template_fields(ds)
    if fmt == "alpaca":
        return ["instruction", "output"]
    if fmt == "preference":
        return sorted(PREFERENCE_COLUMNS)
    if fmt == "messages":
        if "messages" not in mapping and "messages" not in columns and "conversations" in columns:
            mapping["messages"] = "conversations"
        return ["messages"]
    if fmt == "prompt_completion":
        for name, aliases in (("prompt", PROMPT_ALIASES), ("completion", COMPLETION_ALIASES)):
            if name not in mapping:
                mapping[name] = next((a for a in aliases if a in columns), name)
        return ["prompt", "completion"]
    return ["text"]


def make_example(row: Mapping[str, Any], ds: DatasetConfig, fmt: ResolvedFormat) -> Example:
    """Turn one row into an :class:`Example`; raises :class:`BadRowError` when it cannot."""
    if row.get(UNREADABLE_COLUMN):
        reason, detail = row[UNREADABLE_COLUMN]
        raise BadRowError(str(reason), str(detail))
    if row.get(ENCODING_ERROR_COLUMN):
        raise BadRowError("bad_encoding", f"{row.get('path')}: {row[ENCODING_ERROR_COLUMN]}")
    if fmt.format == "messages":
        return _conversation(row, fmt, ds)
    if fmt.format == "text":
        return Example(response=_text(row, "text", fmt))
    prompt, response = _prompt_response(row, ds, fmt)
    if ds.use_chat_template:
        turns = ((("system", ds.system_prompt),) if ds.system_prompt else ()) + (
            ("user", prompt),
            ("assistant", response),
        )
        return Example(messages=turns)
    if ds.system_prompt:
        prompt = f"{ds.system_prompt}\n\n{prompt}"
    return Example(prompt=prompt, response=response)


def _prompt_response(row: Mapping[str, Any], ds: DatasetConfig, fmt: ResolvedFormat) -> tuple[str, str]:
    if fmt.format == "template":
        values = {name: _text(row, name, fmt) for name in template_fields(ds)}
        return (ds.input_template or "").format(**values), (ds.output_template or "").format(**values)
    if fmt.format == "alpaca":
        instruction, output = _text(row, "instruction", fmt), _text(row, "output", fmt)
        extra = _text(row, "input", fmt, optional=True) if "input" in fmt.columns else ""
        if ds.use_chat_template:
            return (f"{instruction}\n\n{extra}" if extra else instruction), output
        block = f"### Input:\n{extra}\n\n" if extra else ""
        return ALPACA_RAW.format(instruction=instruction, input_block=block), output
    return _text(row, "prompt", fmt), _text(row, "completion", fmt)


def _text(row: Mapping[str, Any], name: str, fmt: ResolvedFormat, *, optional: bool = False) -> str:
    column = fmt.columns.get(name, name)
    value = row.get(column)
    if value is None:
        if optional:
            return ""
        raise BadRowError("missing_field", f"field {name!r} (column {column!r}) is missing or null")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BadRowError("wrong_type", f"field {name!r} (column {column!r}) is a {type(value).__name__}, not text")
    if not isinstance(value, str) and column in fmt.text_columns:
        raise BadRowError("wrong_type", f"field {name!r} (column {column!r}) is the number {value!r} where the "
                                        "other rows hold text")  # fmt: skip
    text = str(value)
    if not text.strip() and not optional:
        raise BadRowError("empty_field", f"field {name!r} (column {column!r}) is empty")
    return text


def _conversation(row: Mapping[str, Any], fmt: ResolvedFormat, ds: DatasetConfig) -> Example:
    column = fmt.columns["messages"]
    turns = list(parse_chat_turns(row.get(column), column))
    if not any(role == "assistant" for role, _, _ in turns):
        raise BadRowError("no_assistant_turn", f"none of the {len(turns)} turns is an assistant turn")
    if ds.system_prompt and turns[0][0] != "system":
        turns.insert(0, ("system", ds.system_prompt, {}))
    tools_value = row.get(fmt.columns["tools"]) if "tools" in fmt.columns else None
    uses_tools = tools_value not in (None, "", []) or any(
        role == "tool" or turn.get("tool_calls") for role, _, turn in turns
    )
    if not uses_tools:
        return Example(messages=tuple((role, content) for role, content, _ in turns))
    try:
        tools = normalize_tools(tools_value)
        chat = tool_conversation(turns, tools)
    except ToolUseError as bad:
        raise BadRowError(bad.reason, bad.detail) from None
    plain = tuple((m["role"], m["content"]) for m in default_messages(chat, tools))
    return Example(messages=plain, chat=chat, tools=tools)


def parse_turns(turns: Any, column: str) -> tuple[tuple[str, str], ...]:
    """A column's chat turns (OpenAI role/content or ShareGPT from/value) as (role, content) pairs;
    :class:`BadRowError` for a value that is not a non-empty list of well-formed turns. Tool turns
    and tool calls are refused here (``unknown_role``): only a messages row takes them."""
    out = []
    for number, (role, content, turn) in enumerate(parse_chat_turns(turns, column)):
        if role == "tool" or turn.get("tool_calls"):
            what = f"has role {turn.get('role', turn.get('from'))!r}" if role == "tool" else "calls a tool"
            raise BadRowError("unknown_role", f"turn {number} {what}; tool use is read from messages rows only")
        out.append((role, content))
    return tuple(out)


def parse_chat_turns(turns: Any, column: str) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """A column's chat turns as (role, content, the turn as given), roles mapped to system/user/assistant/tool.
    The column may hold the list itself or its JSON text.

    An assistant turn that holds ``tool_calls`` may have no content; a tool turn's content may be a
    JSON value (kept as its JSON text). :class:`BadRowError` for a value that is not a non-empty list
    of well-formed turns.
    """
    if turns is None:
        raise BadRowError("missing_field", f"column {column!r} is missing or null")
    if isinstance(turns, str) and turns.lstrip().startswith("["):
        turns = _json_turns(turns, column)
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise BadRowError(
            "wrong_type", f"column {column!r} must be a list of turns (objects), got {type(turns).__name__}"
        )
    if not turns:
        raise BadRowError("empty_field", f"column {column!r} holds no turns")
    return tuple(_chat_turn(number, turn) for number, turn in enumerate(turns))


def _json_turns(text: str, column: str) -> Any:
    """The turns of a column that holds them as JSON text (as Parquet and CSV files often do)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRowError("wrong_type", f"column {column!r} is text that is not a JSON list of turns ({exc.msg} "
                                        f"at column {exc.colno})") from None  # fmt: skip


def _chat_turn(number: int, turn: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    raw_role = turn.get("role") if turn.get("role") is not None else turn.get("from")
    content = turn.get("content") if turn.get("content") is not None else turn.get("value")
    calls = bool(turn.get("tool_calls"))  # an assistant turn that only calls tools has no content
    if raw_role is None or (content is None and not calls):
        raise BadRowError("missing_field", f"turn {number} lacks role/content (or from/value)")
    if not isinstance(raw_role, str):
        raise BadRowError("wrong_type", f"turn {number}: role and content must be text")
    role = "tool" if raw_role in TOOL_ROLES else ROLE_ALIASES.get(raw_role)
    if role == "tool" and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)  # a result given as a JSON value
    content = "" if content is None else content
    if not isinstance(content, str):
        raise BadRowError("wrong_type", f"turn {number}: role and content must be text")
    if role is None:
        raise BadRowError("unknown_role", f"turn {number} has role {raw_role!r}; use system, user, assistant or tool")
    if not content.strip() and role == "assistant" and not calls:
        raise BadRowError("empty_field", f"turn {number} (assistant) is empty")
    return role, content, turn
