"""Calculator tool-use traces from symbolic SDG rows (sdg.tool_use), large operands (sdg.operand_scale), and
the traces as the training data reader sees them: written by the SDG store, read back, tokenized."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rayft.calculator import calculate
from rayft.config import load_config
from rayft.config.data import DatasetConfig
from rayft.data.formats import resolve_format
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.read.rows import iter_rows
from rayft.data.tokenize import TextTokenizer, TokenizeJob, tokenize_rows
from rayft.environments.builtin import calculator_tool
from rayft.errors import ConfigError
from rayft.sdg.mathcheck import check_math_answer, parse_annotations, parse_number
from rayft.sdg.plan import plan_sdg
from rayft.sdg.rows import QualityStage, SymbolicStage, seed_id
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import part_record
from rayft.sdg.symbolic import TEXT_NUMBER, analyze_seed, make_variation
from rayft.sdg.tool_traces import CALCULATOR_TOOL, ToolTraceStage, calculator_trace
from rayft.testing.tiny import build_tiny_tokenizer

NATALIA_Q = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
NATALIA_A = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
SEEDS = [{"seed_id": seed_id(NATALIA_Q, NATALIA_A), "seed_question": NATALIA_Q, "seed_answer": NATALIA_A}]
QWEN = Path(__file__).parents[1] / "support" / "chat_templates" / "qwen2_5.jinja"


def test_a_trace_calls_the_calculator_once_per_annotation_then_answers() -> None:
    trace = calculator_trace(NATALIA_Q, NATALIA_A)
    assert trace == [
        {"role": "user", "content": NATALIA_Q},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "48/2"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "24"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression": "48+24"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "72"},
        {"role": "assistant", "content": NATALIA_A},
    ]  # fmt: skip


def test_a_trace_lists_and_answers_the_calculator_as_an_episode_does() -> None:
    """The schema is the tools environment's and each tool turn is what its calculator returns (a float's
    digits included), so training shows the model the tool as RL and eval episodes will."""
    answer = "Each gets 70*.01*90 = <<70*.01*90=63>>63 cents, 10/4 = <<10/4=2.5>>2.5 each.\n#### 2.5"
    trace = calculator_trace("How much?", answer)
    calls = [json.loads(m["tool_calls"][0]["function"]["arguments"])["expression"] for m in trace if "tool_calls" in m]
    results = [m["content"] for m in trace if m["role"] == "tool"]
    assert results == [calculate(expression) for expression in calls] == ["63.00000000000001", "2.5"]
    assert calculator_tool().schema == CALCULATOR_TOOL


def test_the_stage_traces_accepted_rows_and_rejects_a_row_it_cannot_trace() -> None:
    rows = SymbolicStage(variations=2, max_attempts=50, seed=3, config_hash="h")(SEEDS)
    rows.append({**rows[0], "id": "bad", "answer": "48/2 = <<48/2=25>>25\n#### 25"})  # a wrong step
    rows.append({**rows[0], "id": "earlier", "reject_stage": "quality", "reject_reason": "answer_length"})
    traced = ToolTraceStage()(rows)
    for row in traced[:2]:
        messages = json.loads(row["messages"])
        assert messages[0]["content"] == row["question"] and messages[-1]["content"] == row["answer"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert results == [str(a.result) for a in parse_annotations(row["answer"])]
        assert json.loads(row["tools"]) == [CALCULATOR_TOOL]
    assert (traced[2]["reject_stage"], traced[2]["reject_reason"]) == ("tool_traces", "math_annotation_wrong")
    assert traced[3]["reject_reason"] == "answer_length" and traced[3]["messages"] == ""


def test_operand_scale_draws_large_operands_that_still_verify() -> None:
    chain = analyze_seed(NATALIA_Q, NATALIA_A)
    rng = random.Random(0)
    for _ in range(20):
        made = make_variation(chain, rng, 50, 1000)
        assert made is not None
        question, answer = made
        assert check_math_answer(answer) is None  # the chain is re-executed exactly
        (april,) = [n for n in map(parse_number, (m.group() for m in TEXT_NUMBER.finditer(question))) if n > 2]
        assert 24_000 <= april <= 96_000  # near 48 x 1000: in [half, twice] of it


def test_tool_use_adds_the_trace_stage_last_and_the_trace_columns() -> None:
    plan = plan_sdg(load_config(None, ["sdg.tool_use=true", "sdg.operand_scale=100"]).sdg, 1)
    assert [s.name for s in plan.stages] == ["generate", "quality", "tool_traces"]
    assert plan.extra_columns == ("messages", "tools")
    assert plan_sdg(load_config(None, []).sdg, 1).extra_columns == ()
    assert plan.config_hash != plan_sdg(load_config(None, ["sdg.operand_scale=100"]).sdg, 1).config_hash
    with pytest.raises(ConfigError, match="sdg.tool_use makes calculator traces from math solutions"):
        load_config(None, ["sdg.tool_use=true", "sdg.task=instruction", "sdg.generator=llm"])


def _stored_rows(tmp_path: Path) -> Path:
    """Rows made as `rayft sdg` makes them with tool_use, committed and consolidated by the store."""
    rows = SymbolicStage(variations=3, max_attempts=50, seed=5, config_hash="h", operand_scale=1000)(SEEDS)
    rows = QualityStage(True, 10, 2000, 10, 4000)(rows)
    rows = ToolTraceStage()(rows)
    store = SdgStore(tmp_path / "sdg", ("messages", "tools"))
    store.open("h")
    store.commit_part(1, [r for r in rows if not r["reject_reason"]], [], part_record(rows, ["x"], {}))
    store.consolidate()
    return store.data_jsonl


def test_stored_traces_train_the_calls_and_the_answer_with_a_tools_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    data = _stored_rows(tmp_path)
    ds = DatasetConfig(path=str(data))  # format auto: the messages column makes it a conversation
    rows = [item.row for item in iter_rows(ds) if item.row is not None]
    assert len(rows) == 3
    fmt = resolve_format(ds, list(rows[0]))
    assert fmt.format == "messages" and fmt.columns == {"messages": "messages", "tools": "tools"}
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "tok"))
    tokenizer.chat_template = QWEN.read_text()
    job = TokenizeJob(TextTokenizer.from_hf(tokenizer), ((ds, fmt),), 4096, "truncate", False)
    out = tokenize_rows(job, [0, 1, 2], [0, 0, 0], [json.dumps(r) for r in rows])
    assert out["reason"] == ["", "", ""]
    for row, ids, labels in zip(rows, out["input_ids"], out["labels"], strict=True):
        trained = tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])
        steps = parse_annotations(row["answer"])
        calls = [f'{{"name": "calculator", "arguments": {{"expression": "{"".join(s.tokens)}"}}}}' for s in steps]
        assert trained == "".join(f"<tool_call>\n{c}\n</tool_call><|im_end|>\n" for c in calls) + (
            row["answer"] + "<|im_end|>\n"
        )
        assert row["question"] not in trained  # the user turn and the tool results are masked


def test_a_pipeline_without_a_data_section_trains_on_the_traces(tmp_path: Path) -> None:
    from rayft.pipeline.inputs import SDG_PATH, train_data_config
    from rayft.runs.records import StageRecord

    record = StageRecord("sdg", "f", {}, {"data_jsonl": "sdg/data.jsonl"})
    for tool_use, expected in (("true", "messages"), ("false", "template")):
        cfg = load_config(None, [f"sdg.tool_use={tool_use}"])
        (ds,) = train_data_config(cfg, tmp_path, {"sdg": record}).datasets
        assert (ds.format, ds.path) == (expected, str(tmp_path / "sdg" / "data.jsonl")) and SDG_PATH not in ds.path


def test_the_shipped_tool_use_config_makes_traces_and_trains_on_them() -> None:
    cfg = load_config(Path(__file__).parents[2] / "configs" / "tool-use-sft.yaml")
    assert cfg.sdg.tool_use and cfg.sdg.operand_scale == 1000
    assert [(d.path, d.format) for d in cfg.data.datasets] == [("stage:sdg", "messages")]
