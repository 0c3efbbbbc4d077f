"""Constrained decoding and the sampling fields in the continuous-batching engine of `rayft serve` (no Ray):
a random-init model's output parses and validates against its schema every time, over many schemas, seeds
and greedy rows decoding in one batch beside free rows (whose text is what it is alone); forced tool calls
are valid calls of an allowed tool; top_k, min_p and the penalties do what vLLM's sampler does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from rayft.config import ModelConfig
from rayft.serving.engine import Engine, EngineSettings
from rayft.serving.plan import BaseGroup
from rayft.serving.protocol import Job, RequestError, parse_request, to_jobs
from rayft.serving.rows import Finished, Text
from rayft.serving.sampling import Penalties, Sampler
from rayft.serving.tools import split_calls

pytest.importorskip("llguidance")

# Bounded schemas: every instance has a bounded length (strings with maxLength, integers with bounds, arrays
# with maxItems), so even a random model's output closes within max_tokens, the grammar allowing at most one
# space between tokens.
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {
        "type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok", "note"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"enum": [1, "two", None, True]},
    {"const": {"fixed": [1, 2]}},
    {"type": "string", "pattern": "^[a-z]{1,6}$"},
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "tags": {"type": "array", "maxItems": 3, "items": {
        "enum": ["x", "y", "z"]}}}, "required": ["kind", "tags"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["n"], "additionalProperties": False},
               {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"],
                "additionalProperties": False}]},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {"inner": {"type": "object",
        "properties": {"v": {"type": "boolean"}}, "required": ["v"], "additionalProperties": False}},
        "required": ["inner"], "additionalProperties": False}}, "required": ["outer"], "additionalProperties": False},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                                                           "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5},
                                      "b": {"type": "string", "maxLength": 2}}, "additionalProperties": False},
    {"type": "integer", "minimum": 100, "maximum": 120},
]  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": False}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Engine:
    settings = EngineSettings(max_rows=16, max_queued=64)
    return Engine(BaseGroup("base", ModelConfig(name=str(tiny_model_dir)), ()), settings)


def _jobs(**fields: Any) -> list[Job]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Answer in JSON."}], **fields}
    return to_jobs(parse_request(json.dumps(body).encode(), "chat"))


async def _one(engine: Engine, job: Job) -> tuple[str, str]:
    text, reason = "", ""
    async for event in engine.submit(engine.prepare(job, None)):
        if isinstance(event, Finished):
            reason = event.finish_reason
        else:
            text += event.text if isinstance(event, Text) else event
    return text, reason


def _run(engine: Engine, jobs: list[Job]) -> list[tuple[str, str]]:
    async def together() -> list[tuple[str, str]]:
        return list(await asyncio.gather(*(_one(engine, job) for job in jobs)))

    return asyncio.run(together())


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def test_every_output_validates_against_its_schema_in_one_batch_beside_free_rows(engine: Engine) -> None:
    constrained = []
    for index, schema in enumerate(SCHEMAS):
        constrained += _jobs(response_format=_schema_format(schema), max_tokens=96, n=3, seed=index)  # sampled
        constrained += _jobs(response_format=_schema_format(schema), max_tokens=96, temperature=0)  # greedy
    free = _jobs(max_tokens=12, temperature=0) + _jobs(max_tokens=12, temperature=0.8, seed=3)
    results = _run(engine, [*free, *constrained])
    schemas = [s for s in SCHEMAS for _ in range(4)]
    for (text, reason), schema in zip(results[len(free) :], schemas, strict=True):
        assert reason == "stop", (text, schema)
        jsonschema.validate(json.loads(text), schema)
    # A row beside constrained ones samples what it samples alone: the masks are per row.
    assert results[: len(free)] == _run(engine, free)


def test_json_object_outputs_parse_as_objects_when_they_close(engine: Engine) -> None:
    results = _run(engine, _jobs(response_format={"type": "json_object"}, max_tokens=64, n=6, seed=0))
    closed = [text for text, reason in results if reason == "stop"]
    assert closed, results  # the seeds are fixed: some close, the others are cut at max_tokens
    assert all(isinstance(json.loads(text), dict) for text in closed)
    assert all(text.startswith("{") for text, _ in results)


def test_a_length_cut_ends_with_finish_reason_length_as_openai_does(engine: Engine) -> None:
    ((text, reason),) = _run(engine, _jobs(response_format=_schema_format(SCHEMAS[0]), max_tokens=3, temperature=0))
    assert reason == "length" and text.startswith("{")  # the JSON is incomplete, and says so by its finish reason


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "weather"}}])
def test_forced_tool_calls_are_valid_calls_of_an_allowed_tool(engine: Engine, choice: Any) -> None:
    jobs = _jobs(tools=TOOLS, tool_choice=choice, max_tokens=128, n=4, seed=1)
    allowed = {"weather"} if isinstance(choice, dict) else {"add", "weather"}
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for text, reason in _run(engine, jobs):
        content, calls = split_calls(text, allowed)
        assert reason == "stop" and content is None and len(calls) == 1, text
        jsonschema.validate(json.loads(calls[0].arguments), parameters[calls[0].name])


@pytest.mark.parametrize(
    ("schema", "says"),
    [({"type": "object", "properties": {"a": {"type": "strin"}}}, "strin"),
     ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "Unimplemented keys"),  # never a looser grammar
     ({"type": "string", "format": "ipv7"}, "ipv7")],
)  # fmt: skip
def test_a_schema_the_library_cannot_enforce_is_a_400_naming_the_field(
    engine: Engine, schema: dict[str, Any], says: str
) -> None:
    (job,) = _jobs(response_format=_schema_format(schema))
    with pytest.raises(RequestError) as caught:
        engine.prepare(job, None)
    assert caught.value.status == 400 and caught.value.param == "response_format.json_schema.schema"
    assert says in caught.value.message


def _logits(seed: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_penalties_change_the_logits_as_vllm_defines_them() -> None:
    logits = _logits(0)
    sampler = Sampler(0.0, 1.0, None, penalties=Penalties(0.5, 0.25, 1.5), prompt_ids=[1, 2])
    for token in (3, 3, 4):
        sampler.taken(token)
    expected = logits.double().clone()
    for token in (1, 2, 3, 4):  # repetition: over the prompt's and the completion's tokens
        expected[token] = expected[token] / 1.5 if expected[token] > 0 else expected[token] * 1.5
    expected[3] -= 0.25 * 2 + 0.5  # frequency times the count, plus presence, over the completion's tokens
    expected[4] -= 0.25 * 1 + 0.5
    # float32 against float64: one rounding per operation on values of magnitude ~10 (eps 1.2e-7 each).
    assert torch.allclose(sampler._processed(logits).double(), expected, atol=1e-5, rtol=0)
    assert sampler.pick(logits) == int(expected.argmax())


def test_top_k_and_min_p_keep_only_the_tokens_they_allow() -> None:
    for seed in range(20):
        logits = _logits(seed)
        probs = torch.softmax(logits.double(), -1)
        assert Sampler(1.0, 1.0, seed, top_k=1).pick(logits) == int(logits.argmax())
        assert Sampler(1.0, 1.0, seed, min_p=1.0).pick(logits) == int(logits.argmax())
        top3 = set(logits.topk(3).indices.tolist())
        draws = Sampler(1.0, 1.0, seed, top_k=3)
        assert {draws.pick(logits) for _ in range(30)} <= top3
        floor = Sampler(1.0, 1.0, seed, min_p=0.2)
        # min_p compares in float32; the margin covers its rounding of probabilities <= 1.
        assert all(probs[floor.pick(logits)] >= 0.2 * probs.max() - 1e-6 for _ in range(30))
