"""The grammars a served request's output may be held to (pure: the library is imported only to compile).

:mod:`.protocol` turns ``response_format`` and a forced ``tool_choice`` into a :class:`Guide`;
:mod:`.grammar` compiles it for the replica's tokenizer (llguidance) and runs it row by row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rayft.serving.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in the library's type stub only

WHITESPACE = r" ?"
"""Whitespace the JSON grammar allows between tokens: at most one space, so that a model that writes
``{"a": 1}`` may and one that does not need not, and the output's length stays bounded by its content."""


@dataclass(frozen=True)
class Guide:
    """A grammar a request's output must match: JSON of a schema, or one tool call in the default format.

    Attributes:
        kind: ``json`` (the output is one JSON value of ``schema``), or ``tool_call`` (the output is
            ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, ``schema`` the calls allowed).
        schema: The JSON Schema, as JSON text.
        param: The request field it came from, for the error of a schema the library refuses.
    """

    kind: Literal["json", "tool_call"]
    schema: str
    param: str

    def grammar(self) -> str:
        """The grammar in llguidance's form (a JSON Schema grammar, or Lark with an inline ``%json``)."""
        import llguidance

        options: JsonCompileOptions = {"whitespace_pattern": WHITESPACE}
        if self.kind == "json":
            return str(llguidance.LLMatcher.grammar_from_json_schema(self.schema, defaults=options))
        schema = json.dumps({**json.loads(self.schema), "x-guidance": options})
        lark = f"start: {json.dumps(TOOL_CALL_OPEN)} call {json.dumps(TOOL_CALL_CLOSE)}\ncall: %json {schema}\n"
        return str(llguidance.LLMatcher.grammar_from_lark(lark))


def tool_call_schema(tools: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools`` (name, parameters schema): ``{"name", "arguments"}``."""
    calls = [
        {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters or {"type": "object"}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for name, parameters in tools
    ]  # fmt: skip
    return calls[0] if len(calls) == 1 else {"anyOf": calls}
