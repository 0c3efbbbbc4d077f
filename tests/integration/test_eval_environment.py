"""Tools through eval and generate on the tiny model: `rayft compare` runs episodes of the tools environment
with and without the tools (paired tests over the episodes' rows), a user environment's multi-turn
episodes and reward, and `rayft generate` rendering tool rows as training renders them, on Ray actors."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rayft.config import load_config
from rayft.environments import StepResult

pytestmark = pytest.mark.integration


def _cfg(model_dir: Path, *overrides: str):  # type: ignore[no-untyped-def]
    base = [f"model.name={model_dir}", "eval.max_samples=4", "eval.generation.max_new_tokens=6",
            "eval.batch_size=4", "eval.bootstrap_samples=200", "eval.runtime=local"]  # fmt: skip
    return load_config(None, [*base, *overrides])


def test_compare_runs_the_same_episodes_with_and_without_tools(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.recipes.compare import compare_models

    cfg = _cfg(tiny_model_dir, "eval.environment.tools=[calculator]", "eval.environment.max_turns=2",
               "eval.without_tools=[plain]")  # fmt: skip
    result = compare_models(cfg, {"tools": str(tiny_model_dir), "plain": str(tiny_model_dir)}, tmp_path / "cmp")
    summary = result.summary
    tools, plain = summary.models["tools"].episodes, summary.models["plain"].episodes
    assert (tools["with_tools"], plain["with_tools"]) == (True, False)
    assert tools["episodes"] == plain["episodes"] == 4 and 1 <= tools["mean_turns"] <= 2
    test = summary.pairs[0].tests["accuracy_flexible"]  # the paired test runs over the episodes' rows unchanged
    assert test.test == "mcnemar" and 0.0 <= test.p_value <= 1.0
    rows = result.examples
    assert len(rows) == 4
    for row in rows:
        with_tools, without = row["models"]["tools"]["episode"], row["models"]["plain"]["episode"]
        assert with_tools["messages"][0]["role"] == "user" and with_tools["error"] is None
        # the tool list goes into the tools arm's prompt (rayft's default format: the template has none)
        assert with_tools["prompt_tokens"] > without["prompt_tokens"] + 50
    saved = json.loads(result.json_path.read_text())["models"]["tools"]["episodes"]
    assert saved == tools and "## Episodes" in result.markdown_path.read_text()


def test_a_user_environments_turns_and_reward_are_scored(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.recipes.evaluate import evaluate_model

    cfg = _cfg(tiny_model_dir, "eval.environment.type=tests.support.environments:Nudging",
               "eval.environment.options={turns: 3}")  # fmt: skip
    result = evaluate_model(cfg, str(tiny_model_dir), tmp_path / "eval")
    rows = [json.loads(line) for line in result.predictions_path.read_text().splitlines()]
    assert [r["episode"]["turns"] for r in rows] == [3, 3, 3, 3]
    assert [m["content"] for m in rows[0]["episode"]["messages"] if m["role"] == "user"][1:] == ["Go on.", "Go on."]
    reward = result.summary.model.metrics["reward"].estimate
    assert reward.n == 4 and reward.value == sum(r["episode"]["reward"] for r in rows) / 4
    assert result.summary.model.episodes["mean_turns"] == 3


ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}  # fmt: skip
CALLED = [
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 7}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "19"},
]  # fmt: skip


def test_generate_renders_tool_rows_as_training_does(ray_session: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rayft.cli.main import cli
    from rayft.data.tokenize import render_chat

    source = tmp_path / "tools.jsonl"
    rows = [{"id": "called", "messages": CALLED, "tools": [ADD]}, {"id": "plain", "messages": CALLED[:1]},
            {"id": "orphan", "messages": [CALLED[0], CALLED[2]], "tools": [ADD]}]  # fmt: skip
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "gen.jsonl"
    args = ["generate", str(tiny_model_dir), "--input", str(source), "--output", str(out), "--temperature", "0",
            "--max-new-tokens", "4"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    called, plain = (json.loads(line) for line in out.read_text().splitlines())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = render_chat(tokenizer.get_chat_template(), tokenizer.special_tokens_map, CALLED, tools=[ADD],
                       generation_prompt=True)  # fmt: skip
    assert called["num_prompt_tokens"] == len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert '"name": "add"' in text and "<tool_response>\n19\n</tool_response>" in text
    assert isinstance(called["tool_calls"], list) and "tool_calls" not in plain
    (reject,) = [json.loads(line) for line in (tmp_path / "gen.rejects.jsonl").read_text().splitlines()]
    assert (reject["line"], reject["reason"]) == (3, "orphan_tool_result")


class OneResult:
    """Tools that answer a chat's first reply with one result, whatever it says, and end at the second."""

    def __init__(self) -> None:
        self.schemas, self.replies = [ADD], 0

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        self.replies = 0
        return list(row["messages"])

    def step(self, model_turn: str) -> StepResult:
        self.replies += 1
        if self.replies == 1:
            return StepResult([{"role": "tool", "name": "add", "content": "19"}], 0.0, False, {})
        return StepResult([], 0.0, True, {})


def test_chat_answers_a_reply_with_its_tool_results_and_replies_again(tiny_model_dir: Path) -> None:
    from rayft.config.model import ModelConfig
    from rayft.generation.backend import SamplingParams, ToolChat
    from rayft.generation.hf import HFBackend
    from rayft.inference.chat import ChatIO, answer
    from rayft.inference.conversation import Conversation, step

    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu", batch_size=1)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    replies, notes = io.StringIO(), io.StringIO()
    asked = step(Conversation(tools=(ADD,)), "What is 12 + 7?").conversation
    after = answer(backend, asked, params, ChatIO(lambda: None, replies, notes), OneResult())
    assert [role for role, _ in after.turns] == ["user", "assistant", "tool", "assistant"]
    assert after.turns[2] == ("tool", "19") and "[add] 19" in notes.getvalue()
    # each reply is the greedy generation of the conversation so far, rendered with the tools
    first = backend.generate([ToolChat(asked.messages(), [ADD])], params)[0].text
    again = backend.generate([ToolChat(after.messages()[:-1], [ADD])], params)[0].text
    assert replies.getvalue() == f"{first}\n{again}\n" and after.turns[3][1] == again
    assert backend.count_tokens(after.prompt()) > backend.count_tokens(list(after.prompt())) + 50  # the tool list
