"""Tools and structured outputs through `rayft serve` with the real `openai` client: an agent loop (a forced
call, the tool's result, a final answer), streamed and whole; JSON of a schema in every choice, also by the
client's own `parse` helper; unsupported fields refused by name. The model is random-init: constrained
decoding is what makes its calls and its JSON valid."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration
pytest.importorskip("llguidance")

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}  # fmt: skip
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": False}}}  # fmt: skip
TOOLS: list[Any] = [ADD, WEATHER]
QUESTION = [{"role": "user", "content": "What is 12 + 7? Use the tools."}]


@pytest.fixture(scope="module")
def server(ray_session: None, tiny_model_dir: Path) -> Iterator[rayft.ServeHandle]:
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8, "max_tokens": 16}})
    with rayft.api.serve(cfg, [tiny_model_dir], port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server: rayft.ServeHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120) as client:
        yield client


def _run_tool(name: str, arguments: str) -> str:
    args = json.loads(arguments)
    return str(args["a"] + args["b"]) if name == "add" else f"sunny in {args['city']}"


def test_an_agent_loop_calls_a_tool_and_answers_with_its_result(client: openai.OpenAI, server: rayft.ServeHandle
                                                                 ) -> None:  # fmt: skip
    model, messages = server.model_ids[0], list(QUESTION)
    forced: Any = {"type": "function", "function": {"name": "add"}}
    reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=forced,  # type: ignore[arg-type]
                                           max_tokens=128, temperature=0.7, seed=1)  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), ADD["function"]["parameters"])
    messages.append(choice.message)  # as applications do: the response's message goes back as it is
    messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool("add", call.function.arguments)})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",  # type: ignore[arg-type]
                                           max_tokens=8, temperature=0)  # fmt: skip
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason in ("stop", "length")
    alone = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice="none",  # type: ignore[arg-type]
                                           max_tokens=1)  # fmt: skip
    assert final.usage is not None and alone.usage is not None  # the call and its result went into the prompt:
    assert final.usage.prompt_tokens > alone.usage.prompt_tokens + 10


def _streamed_calls(stream: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """(content, calls, finish reason) of a stream, the calls put together from their deltas by index."""
    content, calls, reason = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += part.id or ""
            entry["name"] += (part.function and part.function.name) or ""
            entry["arguments"] += (part.function and part.function.arguments) or ""
        reason = chunk.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_a_streamed_agent_loop_gets_tool_call_deltas(client: openai.OpenAI, server: rayft.ServeHandle) -> None:
    model, messages = server.model_ids[0], list(QUESTION)
    stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                            max_tokens=128, stream=True, seed=2)  # fmt: skip
    content, calls, reason = _streamed_calls(stream)
    assert reason == "tool_calls" and content == "" and len(calls) == 1
    (call,) = calls
    tool = next(t for t in TOOLS if t["function"]["name"] == call["name"])
    jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": _run_tool(call["name"], call["arguments"])})
    final = client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True, temperature=0)  # type: ignore[arg-type]
    _, more, reason = _streamed_calls(final)
    assert more == [] and reason in ("stop", "length")


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {
    "type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array", "maxItems": 3, "items": {
    "enum": ["a", "b"]}}}, "required": ["name", "age", "tags"], "additionalProperties": False}  # fmt: skip


def test_every_choice_of_a_json_schema_request_validates(client: openai.OpenAI, server: rayft.ServeHandle) -> None:
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model=server.model_ids[0], messages=QUESTION, n=4, seed=0,  # type: ignore[arg-type]
                                           response_format=response_format, max_tokens=128)  # fmt: skip
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    assert len({c.message.content for c in reply.choices}) > 1  # the choices sample apart


MORE_SCHEMAS: list[dict[str, Any]] = [
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"enum": [1, "two", None, True]},
    {"type": "string", "pattern": "^[a-z]{1,6}$"},
    {"anyOf": [{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["n"], "additionalProperties": False},
               {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"],
                "additionalProperties": False}]},
    {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
                     "required": ["x"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/p"}, "to": {"$ref": "#/$defs/p"}},
     "required": ["from", "to"], "additionalProperties": False},
]  # fmt: skip


def test_streamed_and_whole_replies_validate_over_many_schemas(client: openai.OpenAI, server: rayft.ServeHandle
                                                              ) -> None:  # fmt: skip
    for index, schema in enumerate(MORE_SCHEMAS):
        response_format: Any = {"type": "json_schema", "json_schema": {"name": f"s{index}", "schema": schema}}
        fields: Any = {"model": server.model_ids[0], "messages": QUESTION, "response_format": response_format,
                       "max_tokens": 96, "seed": index}  # fmt: skip
        whole = client.chat.completions.create(**fields, n=2)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                           client.chat.completions.create(**fields, stream=True) if chunk.choices)  # fmt: skip
        for text in [*(c.message.content or "" for c in whole.choices), streamed]:
            jsonschema.validate(json.loads(text), schema)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


def test_the_clients_parse_helper_gets_its_pydantic_model(client: openai.OpenAI, server: rayft.ServeHandle) -> None:
    parsed = client.chat.completions.parse(model=server.model_ids[0], messages=QUESTION, response_format=Person,  # type: ignore[arg-type]
                                           max_tokens=128, seed=3)  # fmt: skip
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_unsupported_fields_are_refused_by_name(client: openai.OpenAI, server: rayft.ServeHandle) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=server.model_ids[0], messages=QUESTION, logit_bias={"5": 10})  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "logit_bias" and "does not support" in error["message"]
