"""Tools, tool_choice, response_format, n and the sampling fields of `rayft serve` without a model: requests
parsed and refused by name, the tools rendered into the prompt, and the model's calls read back from known
text, whole and streamed in pieces of every size, as OpenAI's clients receive them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rayft.data.tools import default_messages, with_object_arguments
from rayft.serving.choices import ChoiceStream, whole_choice
from rayft.serving.protocol import ChatRequest, RequestError, ResponseBuilder, parse_request, to_jobs
from rayft.serving.tools import Call, CallStream, split_calls, tool_messages

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]  # fmt: skip
ANSWER = (
    'Let me compute that.\n<tool_call>{"name": "add", "arguments": {"a": 12, "b": 7}}</tool_call>\n'
    '<tool_call>{"name": "weather", "parameters": {"city": "Paris"}}</tool_call>'
)


def _chat(**fields: Any) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "12 + 7?"}], **fields}
    request = parse_request(json.dumps(body).encode(), "chat")
    assert isinstance(request, ChatRequest)
    return request


def test_calls_are_read_out_of_a_whole_answer() -> None:
    content, calls = split_calls(ANSWER, {"add", "weather"})
    assert content == "Let me compute that."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("add", {"a": 12, "b": 7}), ("weather", {"city": "Paris"})]  # fmt: skip
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in calls) and calls[0].id != calls[1].id
    # A call of a tool not offered, or a block that is no call, stays text as the model wrote it.
    assert split_calls(ANSWER, {"add"})[0] == 'Let me compute that.\n\n<tool_call>{"name": "weather", "parameters": ' \
                                             '{"city": "Paris"}}</tool_call>'  # fmt: skip
    broken = "<tool_call>{not json}</tool_call>"
    assert split_calls(broken, {"add"}) == (broken, [])
    assert split_calls("plain text", {"add"}) == ("plain text", [])


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 1000])
def test_a_streamed_answer_gives_the_same_content_and_calls_in_pieces_of_any_size(size: int) -> None:
    stream, parts = CallStream({"add", "weather"}), []
    for start in range(0, len(ANSWER), size):
        parts += stream.feed(ANSWER[start : start + size])
    parts += stream.flush()
    calls = [p for p in parts if isinstance(p, Call)]
    text = "".join(p for p in parts if isinstance(p, str))
    assert text.strip() == "Let me compute that."
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in split_calls(ANSWER)[1]]
    cut = CallStream({"add"})  # an answer cut inside a call (max_tokens) hands the call's text on at the end
    assert cut.feed('ok <tool_call>{"name": "ad') == ["ok "] and cut.flush() == ['<tool_call>{"name": "ad']


def test_a_whole_choice_carries_tool_calls_and_finishes_with_tool_calls() -> None:
    request = _chat(tools=TOOLS)
    (job,) = to_jobs(request)
    choice = whole_choice(ResponseBuilder("chat", "m"), 0, job, ANSWER, "stop", logprobs=None)
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me compute that."
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["add", "weather"]
    assert all(c["type"] == "function" and isinstance(c["function"]["arguments"], str)
               for c in choice["message"]["tool_calls"])  # fmt: skip
    (single,) = to_jobs(_chat(tools=TOOLS, parallel_tool_calls=False))
    one = whole_choice(ResponseBuilder("chat", "m"), 0, single, ANSWER, "stop", logprobs=None)
    assert len(one["message"]["tool_calls"]) == 1
    (none,) = to_jobs(_chat(tools=TOOLS, tool_choice="none"))
    text = whole_choice(ResponseBuilder("chat", "m"), 0, none, ANSWER, "stop", logprobs=None)
    assert text["message"] == {"role": "assistant", "content": ANSWER} and text["finish_reason"] == "stop"


def test_streamed_calls_are_openai_tool_call_deltas() -> None:
    (job,) = to_jobs(_chat(tools=TOOLS))
    stream = ChoiceStream(ResponseBuilder("chat", "m"), 0, job)
    chunks = [c for piece in ANSWER for c in stream.piece(piece, None)] + stream.finish("stop")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            if "id" in call:
                assert call["id"].startswith("call_") and call["type"] == "function"
                entry["name"] += call["function"]["name"]
            entry["arguments"] += call["function"]["arguments"]
    assert content.strip() == "Let me compute that."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("add", {"a": 12, "b": 7}), ("weather", {"city": "Paris"})]  # fmt: skip
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


CONVERSATION = [
    {"role": "user", "content": "12 + 7?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 7}'}}],
     "refusal": None, "annotations": [], "audio": None, "function_call": None},
    {"role": "tool", "tool_call_id": "call_1", "content": "19"},
]  # fmt: skip


def test_an_agent_conversation_is_taken_and_rendered_in_the_default_format() -> None:
    (job,) = to_jobs(_chat(messages=CONVERSATION, tools=TOOLS))
    assert isinstance(job.prompt, list) and job.prompt[1]["tool_calls"][0]["function"]["name"] == "add"
    assert job.tools.calls == frozenset({"add", "weather"}) and job.tools.guide is None
    messages, extra = tool_messages(job.prompt, job.tools.tools, "{{ messages }}")  # a template without tools
    assert extra == {} and messages == default_messages(with_object_arguments(job.prompt), job.tools.tools)
    assert messages[0]["role"] == "system" and '"name": "add"' in messages[0]["content"]
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 7}}</tool_call>',
    }
    assert messages[3] == {"role": "user", "content": "<tool_response>\n19\n</tool_response>"}
    template = "{% for t in tools %}{{ t }}{% endfor %}{% for m in messages %}{{ m.tool_calls }}{% endfor %}"
    messages, extra = tool_messages(job.prompt, job.tools.tools, template)
    assert extra == {"tools": list(job.tools.tools)} and messages == with_object_arguments(job.prompt)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 12, "b": 7}  # templates write objects


def test_forced_calls_and_response_formats_become_grammars() -> None:
    (required,) = to_jobs(_chat(tools=TOOLS, tool_choice="required"))
    assert required.tools.guide is not None and required.tools.guide.kind == "tool_call"
    schema = json.loads(required.tools.guide.schema)
    assert [c["properties"]["name"]["const"] for c in schema["anyOf"]] == ["add", "weather"]
    (named,) = to_jobs(_chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "weather"}}))
    assert named.tools.calls == frozenset({"weather"}) and named.tools.single_call
    assert json.loads(named.tools.guide.schema)["properties"]["arguments"] == TOOLS[1]["function"]["parameters"]
    (obj,) = to_jobs(_chat(response_format={"type": "json_object"}))
    assert obj.tools.guide is not None and json.loads(obj.tools.guide.schema) == {"type": "object"}
    (text,) = to_jobs(_chat(response_format={"type": "text"}))
    assert text.tools.guide is None
    (none,) = to_jobs(_chat(tools=TOOLS, tool_choice="none"))
    assert none.tools.tools == () and none.tools.calls is None


def test_n_choices_sample_apart_and_sampling_fields_reach_the_job() -> None:
    jobs = to_jobs(_chat(n=3, seed=5, top_k=4, min_p=0.1, presence_penalty=0.5, frequency_penalty=-0.5,
                         repetition_penalty=1.2))  # fmt: skip
    assert [(j.seed, j.copy) for j in jobs] == [(5, 0), (6, 1), (7, 2)]
    assert {(j.top_k, j.min_p, j.presence_penalty, j.frequency_penalty, j.repetition_penalty) for j in jobs} == {
        (4, 0.1, 0.5, -0.5, 1.2)}  # fmt: skip
    batch = to_jobs(parse_request(json.dumps({"model": "m", "prompt": ["a", "b"], "n": 2}).encode(), "completion"))
    assert [(j.prompt, j.copy, j.seed) for j in batch] == [("a", 0, None), ("a", 1, None), ("b", 0, None),
                                                            ("b", 1, None)]  # fmt: skip
    assert to_jobs(_chat(top_k=-1))[0].top_k == 0  # -1, as vLLM takes it: every token


def _refused(fields: dict[str, Any], endpoint: str = "chat") -> RequestError:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat" else {
        "model": "m", "prompt": "hi"}  # fmt: skip
    with pytest.raises(RequestError) as caught:
        parse_request(json.dumps({**base, **fields}).encode(), endpoint)  # type: ignore[arg-type]
    assert caught.value.status == 400 and caught.value.body()["error"]["type"] == "invalid_request_error"
    return caught.value


@pytest.mark.parametrize(
    ("fields", "endpoint", "param", "says"),
    [
        ({"logit_bias": {"5": 10}}, "chat", "logit_bias", "does not support 'logit_bias'"),
        ({"temprature": 0.5}, "chat", "temprature", "does not support 'temprature'"),
        ({"functions": [{"name": "f"}]}, "chat", "functions", "send them as tools"),
        ({"best_of": 2}, "completion", "best_of", "ask for n choices"),
        ({"suffix": "x"}, "completion", "suffix", "does not support 'suffix'"),
        ({"tools": TOOLS}, "completion", "tools", "does not support 'tools'"),
        ({"response_format": {"type": "json_object"}}, "completion", "response_format", "does not support"),
        ({"tool_choice": "required"}, "chat", "tool_choice", "tool_choice needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "mul"}}},
            "chat",
            "tool_choice",
            "'mul', which is not one of the tools (add, weather)",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "chat",
            "response_format",
            "cannot be enforced together",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "chat", "tools", "the same function name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "chat", "tools.0.function.name", "pattern"),
        ({"tool_choice": "sometimes", "tools": TOOLS}, "chat", "tool_choice", "'none', 'auto' or 'required'"),
        ({"response_format": {"type": "json_schema"}}, "chat", "response_format", "needs json_schema"),
        ({"response_format": {"type": "yaml"}}, "chat", "response_format.type", "'text', 'json_object' or"),
        ({"messages": [{"role": "tool", "content": "19"}]}, "chat", "messages.0", "needs tool_call_id"),
        ({"messages": [{"role": "assistant"}]}, "chat", "messages.0", "content is missing"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "chat", "messages.0", "belong to"),
        (
            {"messages": [{"role": "user", "content": "x", "mood": "happy"}]},
            "chat",
            "messages.0.mood",
            "does not support 'mood'",
        ),
        ({"echo": True, "n": 2, "max_tokens": 0}, "completion", "n", "echo scores the prompt once"),
    ],
)
def test_what_is_not_honoured_is_refused_by_name(fields: dict[str, Any], endpoint: str, param: str, says: str) -> None:
    error = _refused(fields, endpoint)
    assert error.param is not None and error.param.startswith(param) and says in error.message, error.message
