"""Tool-use rows (assistant tool_calls, tool results, the row's tools) rendered and masked with three real
chat templates that render tools, and with rayft's default tool format for one that does not; each reject.

The templates in tests/support/chat_templates are those shipped by Qwen2.5 Instruct (Hermes-style
``<tool_call>`` JSON), Llama 3.1 Instruct (a bare JSON call with ``parameters``, results in the ``ipython``
role, the tools in the first user turn) and LFM2 (Pythonic calls between special tokens), loaded offline
into a tiny tokenizer with each template's special tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.config.data import DatasetConfig
from rayft.data.formats import REASONS, make_example, resolve_format
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.tokenize import TextTokenizer, TokenizeJob, render, template_renders_tools, tokenize_rows
from rayft.data.tools import (
    ToolCall,
    ToolUseError,
    default_messages,
    parse_tool_calls,
    render_tool_call,
    split_tool_calls,
)
from rayft.testing.tiny import build_tiny_tokenizer

TEMPLATES = Path(__file__).parents[1] / "support" / "chat_templates"
SPECIAL = {
    "qwen2_5": ([], None),
    "llama3_1": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>"),
    "lfm2_v2": (["<|startoftext|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_list_start|>",
                 "<|tool_list_end|>", "<|tool_response_start|>", "<|tool_response_end|>"], "<|startoftext|>"),
}  # fmt: skip

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
WEATHER = {  # given bare (without the type/function wrapper), as some datasets write it
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _conversation() -> list[dict[str, Any]]:
    """Two exchanges, each a call (arguments as JSON text, then as an object), its result and an answer."""
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 123456 * 789?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "123456 * 789"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "97406784"},
        {"role": "assistant", "content": "123456 * 789 = 97406784."},
        {"role": "user", "content": "And the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "sunny, 21 C"},
        {"role": "assistant", "content": "It is sunny in Paris (21 C)."},
    ]  # fmt: skip


def _as_transformers_takes_it(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as transformers documents it for templates: arguments as objects."""
    out = []
    for given in messages:
        message = {**given, "content": given["content"] or ""}
        if "tool_calls" in message:
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _object(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def _object(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def _tokenizer(tmp_path: Path, name: str | None) -> Any:
    """The tiny BPE tokenizer with template ``name`` (None: its own ChatML, which renders no tools)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / (name or "chatml")))
    if name is not None:
        extra, bos = SPECIAL[name]
        tokenizer.add_special_tokens({"additional_special_tokens": extra, **({"bos_token": bos} if bos else {})})
        tokenizer.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return tokenizer


def _tokenize(tokenizer: Any, rows: list[dict[str, Any]], **mapping: str) -> list[dict[str, Any]]:
    ds = DatasetConfig(path="x.jsonl", format="messages", field_mapping=mapping)
    fmt = resolve_format(ds, sorted({k for r in rows for k in r}))
    job = TokenizeJob(TextTokenizer.from_hf(tokenizer), ((ds, fmt),), 4096, "truncate", False)
    out = tokenize_rows(job, list(range(len(rows))), [0] * len(rows), [json.dumps(r) for r in rows])
    return [dict(zip(out, values, strict=True)) for values in zip(*out.values(), strict=True)]


def _trained_runs(tokenizer: Any, row: dict[str, Any]) -> list[str]:
    """The decoded runs of consecutive trained tokens (one per assistant turn)."""
    runs: list[list[int]] = []
    previous = False
    for token, label in zip(row["input_ids"], row["labels"], strict=True):
        trained = label != IGNORE_INDEX
        if trained and not previous:
            runs.append([])
        if trained:
            runs[-1].append(token)
        previous = trained
    return [tokenizer.decode(run) for run in runs]


# What each template renders for the five assistant turns: exactly the trained text. (The first token of a
# row is never trained, and the opening "\n" of Qwen's call turns belongs to its assistant header.)
EXPECTED_TURNS = {
    "qwen2_5": [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123456 * 789"}}\n</tool_call><|im_end|>\n',
        "123456 * 789 = 97406784.<|im_end|>\n",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
        "It is sunny in Paris (21 C).<|im_end|>\n",
    ],
    "llama3_1": [
        '{"name": "calculator", "parameters": {"expression": "123456 * 789"}}<|eot_id|>',
        "123456 * 789 = 97406784.<|eot_id|>",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        "It is sunny in Paris (21 C).<|eot_id|>",
    ],
    "lfm2_v2": [
        "<|tool_call_start|>[calculator(expression='123456 * 789')]<|tool_call_end|><|im_end|>\n",
        "123456 * 789 = 97406784.<|im_end|>\n",
        "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|><|im_end|>\n",
        "It is sunny in Paris (21 C).<|im_end|>\n",
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_TURNS))
def test_a_template_with_tools_renders_as_transformers_does(tmp_path: Path, name: str) -> None:
    tokenizer = _tokenizer(tmp_path, name)
    assert template_renders_tools(tokenizer.chat_template)
    row = {"messages": _conversation(), "tools": [CALCULATOR, WEATHER]}
    ds = DatasetConfig(path="x.jsonl", format="messages")
    example = make_example(row, ds, resolve_format(ds, ["messages", "tools"]))
    rendered = render(example, TextTokenizer.from_hf(tokenizer), train_on_prompt=False)
    tools = [CALCULATOR, {"type": "function", "function": WEATHER}]
    expected = tokenizer.apply_chat_template(_as_transformers_takes_it(_conversation()), tools=tools, tokenize=False)
    assert rendered.text == expected
    assert [rendered.text[lo:hi] for lo, hi in rendered.spans] == [
        tokenizer.apply_chat_template(_as_transformers_takes_it(_conversation()[: i + 1]), tools=tools, tokenize=False)[
            len(tokenizer.apply_chat_template(_as_transformers_takes_it(_conversation()[:i]), tools=tools,
                                              tokenize=False, add_generation_prompt=True)):
        ]
        for i, m in enumerate(_conversation()) if m["role"] == "assistant"
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED_TURNS))
def test_only_the_assistant_turns_and_their_calls_are_trained(tmp_path: Path, name: str) -> None:
    tokenizer = _tokenizer(tmp_path, name)
    (row,) = _tokenize(tokenizer, [{"messages": _conversation(), "tools": [CALCULATOR, WEATHER]}])
    assert row["reason"] == ""
    runs = _trained_runs(tokenizer, row)
    assert "".join(runs) == "".join(EXPECTED_TURNS[name])
    trained = "".join(runs)
    for prompt_text in ("97406784\n", "sunny, 21 C", "Evaluate an arithmetic expression", "weather in Paris?",
                        "careful assistant"):  # fmt: skip
        assert prompt_text not in trained  # tool results, the tool list, user and system turns are masked
    assert len(runs) == 4  # each assistant turn a run of its own: the tool results between them are masked


def test_a_template_without_tools_gets_the_default_format_which_parses_back(tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path, None)  # ChatML: no tools variable
    assert not template_renders_tools(tokenizer.chat_template)
    row = {"messages": _conversation(), "tools": [CALCULATOR, WEATHER]}
    (tokenized,) = _tokenize(tokenizer, [row])
    ds = DatasetConfig(path="x.jsonl", format="messages")
    example = make_example(row, ds, resolve_format(ds, ["messages", "tools"]))
    assert example.chat is not None
    plain = default_messages(example.chat, example.tools)
    assert tokenizer.decode(tokenized["input_ids"]) == tokenizer.apply_chat_template(plain, tokenize=False)
    assert plain[0]["content"].startswith("You are a careful assistant.\n\nYou can call the following tools.")
    assert json.dumps(CALCULATOR) in plain[0]["content"]
    assert plain[3] == {"role": "user", "content": "<tool_response>\n97406784\n</tool_response>"}
    runs = _trained_runs(tokenizer, tokenized)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123456 * 789"}}</tool_call><|im_end|>\n'
    assert runs[0] == call
    assert parse_tool_calls(runs[0]) == [ToolCall("calculator", {"expression": "123456 * 789"}, "call_0")]
    assert runs[1:] == ["123456 * 789 = 97406784.<|im_end|>\n",
                        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>\n',
                        "It is sunny in Paris (21 C).<|im_end|>\n"]  # fmt: skip


def test_parallel_calls_and_their_results_in_one_turn(tmp_path: Path) -> None:
    calls = [("a", "calculator", '{"expression": "2+2"}'), ("b", "get_weather", '{"city": "Oslo"}')]
    both = {"role": "assistant", "content": "Checking both.", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]}  # fmt: skip
    messages = [{"role": "user", "content": "2+2 and Oslo?"}, both,
                {"role": "tool", "tool_call_id": "a", "content": "4"},
                {"role": "tool", "tool_call_id": "b", "content": "snow"},
                {"role": "assistant", "content": "4, and snow in Oslo."}]  # fmt: skip
    for name in ("qwen2_5", None):
        tokenizer = _tokenizer(tmp_path / str(name), name)
        (row,) = _tokenize(tokenizer, [{"messages": messages, "tools": [CALCULATOR, WEATHER]}])
        runs = _trained_runs(tokenizer, row)
        assert len(runs) == 2
        assert "4\n" not in runs[0] and "snow" not in runs[0]
        if name is None:  # the default format: both results in one user turn, both calls parse back
            text, calls = split_tool_calls(runs[0].removesuffix("<|im_end|>\n"))
            assert text == "Checking both."
            assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "2+2"}),
                                                               ("get_weather", {"city": "Oslo"})]  # fmt: skip
            decoded = tokenizer.decode(row["input_ids"])
            assert "<tool_response>\n4\n</tool_response>\n<tool_response>\nsnow\n</tool_response><|im_end|>" in decoded


def _call(name: str, arguments: Any, call_id: str = "c1") -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}  # fmt: skip


USER = {"role": "user", "content": "Compute 6*7."}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "42"}
ANSWER = {"role": "assistant", "content": "42"}
BAD_ROWS = {
    "bad_tool_call": [  # arguments that are not JSON; no name; arguments that are not an object
        {"messages": [USER, _call("calculator", '{"expression": 6*7'), RESULT, ANSWER], "tools": [CALCULATOR]},
        {"messages": [USER, _call("", "{}"), RESULT, ANSWER], "tools": [CALCULATOR]},
        {"messages": [USER, _call("calculator", "[1, 2]"), RESULT, ANSWER], "tools": [CALCULATOR]},
    ],
    "orphan_tool_result": [  # a result before any call; a result naming an id no call has
        {"messages": [USER, RESULT, ANSWER], "tools": [CALCULATOR]},
        {"messages": [USER, _call("calculator", "{}", "c9"), RESULT, ANSWER], "tools": [CALCULATOR]},
    ],
    "unknown_tool": [  # a tool the row does not list; a call in a row with no tools
        {"messages": [USER, _call("python", '{"code": "6*7"}'), RESULT, ANSWER], "tools": [CALCULATOR]},
        {"messages": [USER, _call("calculator", "{}"), RESULT, ANSWER]},
    ],
    "bad_tools": [
        {"messages": [USER, ANSWER], "tools": [{"description": "no name"}]},
        {"messages": [USER, ANSWER], "tools": "not json"},
    ],
}


@pytest.mark.parametrize("reason", sorted(BAD_ROWS))
def test_each_bad_tool_row_is_rejected_with_its_reason(tmp_path: Path, reason: str) -> None:
    tokenizer = _tokenizer(tmp_path, "qwen2_5")
    good = {"messages": [USER, _call("calculator", '{"expression": "6*7"}'), RESULT, ANSWER], "tools": [CALCULATOR]}
    rows = _tokenize(tokenizer, [*BAD_ROWS[reason], good])
    assert [r["reason"] for r in rows] == [reason] * len(BAD_ROWS[reason]) + [""]
    assert all(r["input_ids"] == [] and r["detail"] for r in rows[:-1])
    assert reason in REASONS  # listed, so the stats and rejected.jsonl explain it


def test_a_conversation_the_template_refuses_is_a_rejected_row(tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path, "llama3_1")  # Llama 3.1 takes one call per assistant turn
    function = {"name": "calculator", "arguments": "{}"}
    two = {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": function} for i in ("c1", "c2")]}  # fmt: skip
    two_results = [RESULT, {**RESULT, "tool_call_id": "c2"}]
    good = {"messages": [USER, _call("calculator", "{}"), RESULT, ANSWER], "tools": [CALCULATOR]}
    rows = _tokenize(tokenizer, [{"messages": [USER, two, *two_results, ANSWER], "tools": [CALCULATOR]}, good])
    assert [r["reason"] for r in rows] == ["template_error", ""]
    assert (
        rows[0]["detail"]
        == "the chat template refuses this conversation: This model only supports single tool-calls at once!"
    )


def test_reject_details_name_what_is_wrong(tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path, "qwen2_5")
    details = [r["detail"] for r in _tokenize(tokenizer, [*BAD_ROWS["unknown_tool"], *BAD_ROWS["orphan_tool_result"]])]
    assert details[0] == "turn 1 calls 'python', not one of the row's tools (calculator)"
    assert details[1] == "turn 1 calls 'calculator', not one of the row's tools (none: the row has no tools)"
    assert details[2] == "turn 1 is a tool result with no tool call before it"
    assert details[3] == "turn 2 answers tool_call_id 'c1', which no earlier call has (ids: c9)"


def test_tools_as_json_text_in_a_mapped_column_and_ipython_results(tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path, "llama3_1")
    messages = [USER, _call("calculator", {"expression": "6*7"}), {**RESULT, "role": "ipython"}, ANSWER]
    (row,) = _tokenize(tokenizer, [{"messages": messages, "functions": json.dumps([CALCULATOR])}], tools="functions")
    assert row["reason"] == ""
    assert _trained_runs(tokenizer, row) == ['{"name": "calculator", "parameters": {"expression": "6*7"}}<|eot_id|>',
                                             "42<|eot_id|>"]  # fmt: skip


def test_rows_without_tool_use_render_as_before(tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path, "qwen2_5")
    plain = {"messages": [USER, ANSWER]}
    (row,) = _tokenize(tokenizer, [plain, {**plain, "tools": []}])[:1]
    assert tokenizer.decode(row["input_ids"]) == tokenizer.apply_chat_template([USER, ANSWER], tokenize=False)


def test_parse_tool_calls_reads_the_default_format_and_refuses_a_malformed_block() -> None:
    text = (
        "Let me compute.\n"
        + render_tool_call("calculator", {"expression": "1+1"})
        + "\n"
        + render_tool_call("get_weather", {"city": "Rome"})
    )
    expected = [
        ToolCall("calculator", {"expression": "1+1"}, "call_0"),
        ToolCall("get_weather", {"city": "Rome"}, "call_1"),
    ]
    assert split_tool_calls(text) == ("Let me compute.", expected)
    assert parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>') == [
        ToolCall("f", {"x": 1}, "call_0")
    ]
    qwen = 'Sure.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    assert split_tool_calls(qwen) == ("Sure.", [ToolCall("calculator", {"expression": "1+1"}, "call_0")])
    assert parse_tool_calls("no calls here") == []
    with pytest.raises(ToolUseError, match="tool call 1 of the output is not JSON"):
        parse_tool_calls("<tool_call>{name: f}</tool_call>")
    with pytest.raises(ToolUseError, match="has no function name"):
        parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    call = ToolCall("f", {"x": 1}, "call_0")
    assert call.to_openai(arguments_as_text=True)["function"] == {"name": "f", "arguments": '{"x": 1}'}


@pytest.mark.parametrize("template", ["qwen2_5", None])
def test_generation_renders_a_conversation_as_training_does(tiny_model_dir: Path, template: str | None) -> None:
    """`rayft chat`, `rayft generate` and evaluation (the hf backend) render the prompt of a tool conversation
    exactly as training renders the text before its last assistant turn."""
    from rayft.config import ModelConfig
    from rayft.generation.hf import HFBackend

    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu")
    if template is not None:
        backend.tokenizer.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    row = {"messages": _conversation(), "tools": [CALCULATOR, WEATHER]}
    ds = DatasetConfig(path="x.jsonl", format="messages")
    example = make_example(row, ds, resolve_format(ds, ["messages", "tools"]))
    rendered = render(example, TextTokenizer.from_hf(backend.tokenizer), train_on_prompt=False)
    prompt = _conversation()[:-1]  # as the user gives it: arguments as JSON text, content null
    assert (
        backend.render(prompt, tools=[CALCULATOR, {"type": "function", "function": WEATHER}])
        == (rendered.text[: rendered.spans[-1][0]])
    )


def test_tool_rejects_are_reported_and_counted_by_preparation(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.config import load_config
    from rayft.data.prepare import prepare_data
    from rayft.errors import DataError

    good = {"messages": [USER, _call("calculator", '{"expression": "6*7"}'), RESULT, ANSWER], "tools": [CALCULATOR]}
    rows = [good] * 16 + [row for bad in BAD_ROWS.values() for row in bad[:1]]
    data = tmp_path / "tools.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [f"model.name={tiny_model_dir}", f"data.datasets=[{{path: '{data}'}}]", "data.validation_fraction=0"]
    with pytest.raises(DataError, match=r"4 of 20 rows \(20.0%\) were rejected"):
        prepare_data(load_config(None, base).data, load_config(None, base).model, 0, report_dir=tmp_path / "r",
                     use_ray=False)  # fmt: skip
    report = [json.loads(line) for line in (tmp_path / "r" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["row_id"], r["reason"]) for r in report) == [
        ("tools.jsonl:16", "bad_tool_call"), ("tools.jsonl:17", "orphan_tool_result"),
        ("tools.jsonl:18", "unknown_tool"), ("tools.jsonl:19", "bad_tools"),
    ]  # fmt: skip
    lenient = load_config(None, [*base, "data.max_rejected_fraction=0.25"])
    prepared = prepare_data(lenient.data, lenient.model, 0, report_dir=None, use_ray=False)
    assert prepared.stats["rejected_total"] == 4 and prepared.train.num_units == 16
    assert prepared.stats["rejected_by_reason"] == dict.fromkeys(BAD_ROWS, 1)
