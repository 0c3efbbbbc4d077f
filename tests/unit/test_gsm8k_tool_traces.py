"""benchmarks/gsm8k_tool_traces.py: GSM8K-style rows as calculator traces, plain rows, held-out and rejects.

The rows are written inline in GSM8K's shape (the shared GSM8K file is not read here). The traces are
checked against rayft itself: the data path reads them as tool-use conversations, the tools environment
answers each rendered call with the trace's tool result, and the math reward reads the last turn's answer.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rayft.config.data import DatasetConfig
from rayft.config.environment import EnvironmentConfig
from rayft.data.formats import make_example, resolve_format
from rayft.data.tokenize import render_chat
from rayft.environments import build_environment
from rayft.evaluation import gsm8k
from rayft.evaluation.rewards import math_reward
from rayft.models.registry import CHATML_TEMPLATE

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gsm8k_tool_traces", REPO / "benchmarks" / "gsm8k_tool_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


traces = _load()

NATALIA = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}
WRITTEN = {  # a percentage, thousands commas and dollars inside the annotations
    "question": "A $1,200 bike is 25% off, then $300 of extras are added. What is the price?",
    "answer": "The discount is <<25%*1,200=300>>300 dollars.\nThe bike costs <<$1,200-$300=$900>>$900.\n"
    "With extras it is <<900+300=1,200>>1,200 dollars.\n#### 1,200",
}


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def _calls(messages: list[dict[str, Any]]) -> list[str]:
    return [
        json.loads(call["function"]["arguments"])["expression"]
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls", [])
    ]


def test_several_annotations_become_calls_in_place_with_the_solution_going_on() -> None:
    made = traces.convert(1, NATALIA, traces.calculator_tool())
    messages = made.tools_row["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == NATALIA["question"]
    assert messages[1]["content"] == "Natalia sold 48/2 ="
    assert _calls(messages) == ["48/2", "48+24"]
    assert _tool_results(messages) == ["24", "72"]
    assert [m["tool_calls"][0]["id"] for m in messages if m.get("tool_calls")] == ["call_0", "call_1"]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["call_0", "call_1"]
    assert messages[3]["content"] == "24 clips in May.\nNatalia sold 48+24 ="
    assert messages[-1]["content"] == "72 clips altogether in April and May.\n#### 72"
    plain = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"
    assert made.plain_row["messages"] == [{"role": "user", "content": NATALIA["question"]},
                                          {"role": "assistant", "content": plain}]  # fmt: skip
    assert made.rl_row["messages"] == made.plain_row["messages"]
    assert made.tools_row["tools"] == made.rl_row["tools"] == [traces.calculator_tool().schema]


def test_the_final_turn_is_what_rayfts_gsm8k_scorer_and_math_reward_read() -> None:
    final = traces.convert(1, NATALIA, traces.calculator_tool()).tools_row["messages"][-1]["content"]
    assert gsm8k.extract_strict(final) == "72"
    assert gsm8k.is_correct(gsm8k.extract_flexible(final), gsm8k.reference_answer(NATALIA["answer"]))
    assert math_reward(final, NATALIA["answer"]) == 1.0


def test_percent_commas_and_dollars_are_written_in_the_calculators_syntax() -> None:
    made = traces.convert(2, WRITTEN, traces.calculator_tool())
    messages = made.tools_row["messages"]
    assert _calls(messages) == ["(25/100)*1200", "1200-300", "900+300"]
    assert _tool_results(messages) == ["300", "900", "1200"]
    assert [call.normalised for call in made.calls] == [True, True, False]
    assert messages[-1]["content"].endswith("#### 1,200")
    assert math_reward(messages[-1]["content"], WRITTEN["answer"]) == 1.0
    assert traces.calculator_expression("7 % 3") == "7 % 3"  # a modulo is not a percentage


def test_a_rounded_annotation_keeps_the_calculators_own_answer() -> None:
    row = {"question": "Split 10 dollars three ways.", "answer": "Each gets 10/3 = <<10/3=3.33>>3.33.\n#### 3.33"}
    made = traces.convert(3, row, traces.calculator_tool())
    assert _tool_results(made.tools_row["messages"]) == [str(10 / 3)]
    assert made.calls[0].rounded
    with pytest.raises(traces.TraceError, match="result_mismatch"):
        traces.convert(3, {**row, "answer": "Each gets <<10/3=3.4>>3.4.\n#### 3.4"}, traces.calculator_tool())


def test_traces_are_tool_use_rows_the_data_path_reads_and_the_environment_answers_alike() -> None:
    row = traces.convert(1, NATALIA, traces.calculator_tool()).tools_row
    dataset = DatasetConfig(path="gsm8k.jsonl", format="messages")
    example = make_example(row, dataset, resolve_format(dataset, list(row)))
    assert example.tools == tuple(row["tools"])
    text = render_chat(CHATML_TEMPLATE, {}, row["messages"], tools=row["tools"], generation_prompt=False)
    turn = '<|im_start|>assistant\nNatalia sold 48/2 =\n<tool_call>{"name": "calculator", "arguments": {"expression": '
    assert turn + '"48/2"}}</tool_call><|im_end|>' in text
    environment = build_environment(EnvironmentConfig(tools=["calculator"]), reward=lambda answer, row: 0.0)
    environment.reset({"prompt": NATALIA["question"]})
    assert list(environment.schemas) == row["tools"]  # an episode's prompt lists the tools as training's does
    calling, answers = row["messages"][1:-1:2], row["messages"][2:-1:2]
    for message, answer in zip(calling, answers, strict=True):  # each calling turn, as the model would write it
        arguments = message["tool_calls"][0]["function"]["arguments"]
        block = f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'
        step = environment.step(f"{message['content']}\n{block}")
        assert [m["content"] for m in step.messages] == [answer["content"]]


def test_bad_rows_are_counted_with_their_reason_and_the_others_converted(tmp_path: Path) -> None:
    bad = {
        "annotation_without_equals": {"question": "q1", "answer": "Half is <<48/2>>24.\n#### 24"},
        "result_mismatch": {"question": "q2", "answer": "Half is <<48/2=25>>25.\n#### 25"},
        "calculator_error": {"question": "q3", "answer": "Four times three is <<4x3=12>>12.\n#### 12"},
        "no_final_answer": {"question": "q4", "answer": "Half is <<48/2=24>>24."},
    }
    lines = [json.dumps(NATALIA), *(json.dumps(r) for r in bad.values()), "{not json", json.dumps({"q": 1})]
    source = tmp_path / "train.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    conversion = traces.convert_rows(traces.read_source(source), heldout_count=0, seed=0)
    assert [row["id"] for row in conversion.tools] == [1]
    by_id = {reject["id"]: reject for reject in conversion.rejects}
    assert {by_id[i]["reason"] for i in (2, 3, 4, 5)} == set(bad)
    assert by_id[4]["reason"] == "calculator_error" and "4x3" in by_id[4]["detail"]
    assert by_id[6]["reason"] == by_id[7]["reason"] == "unreadable_row"
    assert by_id[6]["detail"].startswith(f"{source}:6: not JSON")
    assert set(traces.REJECT_REASONS) >= {reject["reason"] for reject in conversion.rejects}


def test_the_heldout_slice_is_seeded_disjoint_and_its_duplicates_are_rejected() -> None:
    rows = [
        {"question": f"Question {i}?", "answer": f"It is <<{i}+1={i + 1}>>{i + 1}.\n#### {i + 1}"} for i in range(40)
    ]
    rows.append({"question": " question 3? ", "answer": "<<3+1=4>>4\n#### 4"})  # line 41 repeats line 4's question
    # a seed that holds out line 4 and trains on line 41, so the duplicate must be caught
    seed = next(s for s in range(100) if 3 in (split := traces.split_heldout(rows, 10, s))[0] and 40 in split[1])
    first = traces.convert_rows(rows, heldout_count=10, seed=seed)
    again = traces.convert_rows(rows, heldout_count=10, seed=seed)
    other = traces.convert_rows(rows, heldout_count=10, seed=seed + 1)
    held = [row["id"] for row in first.heldout]
    assert held == [row["id"] for row in again.heldout] != [row["id"] for row in other.heldout]
    assert len(held) == 10 and 4 in held
    trained = [row["id"] for row in first.tools]
    assert sorted(held + trained + [reject["id"] for reject in first.rejects]) == list(range(1, 42))
    assert first.rejects == [{"id": 41, "reason": "heldout_duplicate", "detail": " question 3? "}]
    assert [row["id"] for row in first.plain] == [row["id"] for row in first.rl] == trained
    assert first.heldout[0]["answer"] == rows[held[0] - 1]["answer"]
