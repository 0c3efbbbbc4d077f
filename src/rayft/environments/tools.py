"""Tools: Python functions with OpenAI function schemas, called with a model's arguments and a time limit.

A :class:`Tool` is a function, its name, its description and its JSON schema (OpenAI's ``parameters``).
:func:`tool_from_function` derives the schema from the function's type hints with pydantic (the model
that validates the arguments is the one the schema comes from, so they cannot disagree), or takes one
given explicitly. A parameter named ``row`` is not the model's: it receives the episode's row (the
``sql`` tool reads its table there) and is left out of the schema.

:func:`call_tool` never raises: bad arguments, an exception, a result that is not text and a call past
its time limit come back as a :class:`ToolOutcome` whose text is the error the model reads.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints

import pydantic

Row = Mapping[str, Any]
MAX_RESULT_CHARS = 4000
"""The longest tool result the model reads; a longer one is cut and says so."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, description, argument schema and arguments' validator."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel] | None = None
    takes_row: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``{"type": "function", "function": {...}}``)."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolOutcome:
    """What a call answered: the text the model reads, and how the call ended."""

    text: str
    status: Literal["ok", "error", "timeout"]


def tool_from_function(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Tool:  # fmt: skip
    """A tool from a typed function; ``parameters``: an explicit JSON schema in place of the derived one
    (the arguments are then checked against the function's signature only)."""
    signature = inspect.signature(fn)
    hints = get_type_hints(fn, include_extras=True)  # keeps Annotated[..., Field(description=...)]
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is inspect.Parameter.empty else p.default)
        for p in signature.parameters.values()
        if p.name != "row"
    }
    model = pydantic.create_model(f"{fn.__name__}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    schema = parameters if parameters is not None else _clean(model.model_json_schema())
    doc = description if description is not None else inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
    return Tool(name or fn.__name__, doc.replace("\n", " "), schema, fn, model, "row" in signature.parameters)


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's schema without its titles (noise in a prompt), with ``properties`` always present."""
    properties = {k: {f: v for f, v in p.items() if f != "title"} for k, p in schema.get("properties", {}).items()}
    cleaned = {"type": "object", "properties": properties}
    if schema.get("required"):
        cleaned["required"] = schema["required"]
    return cleaned


def call_tool(tool: Tool, arguments: Mapping[str, Any], row: Row, timeout_s: float) -> ToolOutcome:
    """Call ``tool`` in a thread of its own, waiting at most ``timeout_s``. A thread cannot be killed:
    a tool that ignores its time keeps running in the background (daemon) while the episode goes on,
    which is why the tools that run untrusted code run it in :mod:`rayft.sandbox`'s processes."""
    try:
        kwargs = _validated(tool, arguments)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        return ToolOutcome(f"Error: bad arguments for {tool.name}: {problems}", "error")
    if tool.takes_row:
        kwargs["row"] = row
    box: dict[str, Any] = {}
    thread = threading.Thread(target=_run_into, args=(tool.fn, kwargs, box), daemon=True, name=f"tool-{tool.name}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return ToolOutcome(f"Error: {tool.name} did not answer within {timeout_s:g} s", "timeout")
    if isinstance(box.get("error"), TimeoutError):  # the tool's own limit (the Python tool's sandbox)
        return ToolOutcome(f"Error: {tool.name} timed out: {box['error']}", "timeout")
    if "error" in box:
        failure = box["error"]
        text = f"Error: {tool.name} failed: {type(failure).__name__}: {failure}"
        return ToolOutcome(text[:MAX_RESULT_CHARS], "error")
    return ToolOutcome(_as_text(box.get("value")), "ok")


def _validated(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    if tool.arguments is None:
        return dict(arguments)
    model = tool.arguments.model_validate(dict(arguments))
    return {name: getattr(model, name) for name in type(model).model_fields}


def _run_into(fn: Callable[..., Any], kwargs: dict[str, Any], box: dict[str, Any]) -> None:
    try:
        box["value"] = fn(**kwargs)
    except BaseException as exc:  # a tool's failure is the model's answer, whatever it is (SystemExit too)
        box["error"] = exc


def _as_text(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) > MAX_RESULT_CHARS:
        return text[:MAX_RESULT_CHARS] + f"\n[cut: the result had {len(text)} characters]"
    return text
