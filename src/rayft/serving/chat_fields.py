"""The parts of a chat completions request beyond plain text (pure): messages with tool calls and tool
results, ``tools``, ``tool_choice`` and ``response_format``, parsed strictly as :mod:`.protocol` parses
the rest, and turned into what a replica needs: the tools to render, the calls to read back, the
grammar (:class:`~rayft.serving.guides.Guide`) that constrained decoding enforces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rayft.serving.guides import Guide, tool_call_schema


def _text_of_parts(parts: list[dict[str, Any]]) -> str:
    """The text of a message given as content parts; only text parts are understood."""
    texts: list[str] = []
    for index, part in enumerate(parts):
        kind = part.get("type")
        if kind != "text":
            raise ValueError(
                f"content part {index} has type {kind!r}; this server reads only text parts "
                "({'type': 'text', 'text': ...}); send the content as text"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"content part {index} (type 'text') needs 'text' as a string; got {text!r:.80}")
        texts.append(text)
    return "\n".join(texts)  # as vLLM joins a message's text parts


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionCall(_Strict):
    """``tool_calls[].function`` of an assistant message: the name and the arguments as JSON text."""

    name: str = Field(min_length=1)
    arguments: str


class ToolCallIn(_Strict):
    """One call of an earlier assistant message, as the client sends it back."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """One message of the conversation: system, user, assistant (text and/or tool calls) or a tool's result.

    ``refusal``, ``annotations``, ``audio`` and ``function_call`` are taken when empty, as the ``openai``
    client sends an assistant message of a response back with them."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    refusal: None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None

    @field_validator("content")
    @classmethod
    def _join_parts(cls, content: str | list[dict[str, Any]] | None) -> str | None:
        return content if content is None or isinstance(content, str) else _text_of_parts(content)

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls belong to assistant messages, not to a {self.role} message")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is missing; only an assistant message with tool_calls may leave it out")
        return self

    def to_prompt(self) -> dict[str, Any]:
        """The message as a chat template takes it (``developer`` is OpenAI's newer name for ``system``)."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": self.content or ""}  # fmt: skip
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionSpec(_Strict):
    """``tools[].function``: a function the model may call."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionSpec


class _Named(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: that function must be called."""

    type: Literal["function"]
    function: _Named


class JsonSchemaSpec(_Strict):
    """``response_format.json_schema``."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``: free text, any JSON object, or JSON of a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type json_schema needs json_schema: {"name": ..., "schema": {...}}')
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"json_schema is read only with type json_schema, not {self.type}")
        return self


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FieldError(ValueError):
    """A combination of fields that cannot be honoured: the field to name and what to do."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param, self.message = param, message


@dataclass(frozen=True)
class ToolUse:
    """What the replica and the router do with a request's tools.

    Attributes:
        tools: The tools rendered into the prompt (none with ``tool_choice: none``).
        calls: The tool names whose calls are read back from the output (None: the output is text).
        guide: The grammar the output must match (a forced call, or ``response_format``'s JSON).
        single_call: Whether at most one call is returned (``parallel_tool_calls: false``, or a forced call).
    """

    tools: tuple[dict[str, Any], ...] = ()
    calls: frozenset[str] | None = None
    guide: Guide | None = None
    single_call: bool = False


def tool_use(tools: list[Tool] | None, choice: ToolChoice | None, response_format: ResponseFormat | None,
             parallel: bool | None) -> ToolUse:  # fmt: skip
    """The :class:`ToolUse` of a request's fields; :class:`FieldError` for a combination that cannot be honoured."""
    names = [tool.function.name for tool in tools or ()]
    if len(set(names)) != len(names):
        raise FieldError("tools", "two tools have the same function name; give each tool its own name")
    if choice is not None and choice != "none" and not tools:
        raise FieldError("tool_choice", "tool_choice needs tools; send tools, or leave tool_choice out")
    json_guide = _format_guide(response_format)
    if not tools or choice == "none":
        return ToolUse(guide=json_guide)
    rendered = tuple(tool.model_dump(exclude_none=True) for tool in tools)
    forced = _forced(tools, choice)
    if forced and json_guide:
        raise FieldError("response_format", "response_format cannot be enforced together with a forced tool call "
                         "(tool_choice required or a named function); leave one of them out")  # fmt: skip
    if forced:
        schema = tool_call_schema([(t.function.name, t.function.parameters) for t in forced])
        guide = Guide("tool_call", json.dumps(schema), "tool_choice")
        return ToolUse(rendered, frozenset(t.function.name for t in forced), guide, single_call=True)
    return ToolUse(rendered, frozenset(names), json_guide, single_call=parallel is False)


def _forced(tools: list[Tool], choice: ToolChoice | None) -> list[Tool]:
    """The tools one of which must be called (none under ``auto``)."""
    if choice == "required":
        return tools
    if isinstance(choice, NamedToolChoice):
        named = [tool for tool in tools if tool.function.name == choice.function.name]
        if not named:
            offered = ", ".join(tool.function.name for tool in tools)
            raise FieldError("tool_choice", f"tool_choice names the function {choice.function.name!r}, which is not "
                             f"one of the tools ({offered})")  # fmt: skip
        return named
    return []


def _format_guide(response_format: ResponseFormat | None) -> Guide | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Guide("json", json.dumps({"type": "object"}), "response_format")
    spec = response_format.json_schema
    schema = spec.schema_ if spec is not None and spec.schema_ is not None else {"type": "object"}
    return Guide("json", json.dumps(schema), "response_format.json_schema.schema")
