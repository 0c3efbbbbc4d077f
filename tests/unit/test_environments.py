"""Environments driven by a scripted model (a list of turns): the tools environment's episodes, its limits
and figures, every way a call or a tool can fail answered and counted, the shipped tools, tool schemas
derived from typed functions, and a user's environment class loaded from its config."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field, ValidationError

from rayft.calculator import CalculatorError, calculate
from rayft.config.environment import EnvironmentConfig
from rayft.config.rl import RlConfig
from rayft.data.builtin.sql import iter_sql_examples
from rayft.environments import (
    EpisodeLimits,
    StepResult,
    ToolsEnvironment,
    build_environment,
    call_tool,
    parse_tool_calls,
    tool_from_function,
)
from rayft.environments.builtin import calculator_tool, python_tool, sql_tool
from rayft.errors import ConfigError, RayftError
from rayft.sandbox import Limits


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def exact_answer(answer: str, row: Any) -> float:
    return float(answer.strip().endswith(str(row["reference"])))


def play(env: Any, row: dict[str, Any], turns: list[str]) -> list[StepResult]:
    """Run the scripted turns until the episode ends; the steps taken."""
    env.reset(row)
    steps = []
    for turn in turns:
        steps.append(env.step(turn))
        if steps[-1].done:
            break
    return steps


def test_an_episode_with_the_calculator_gets_exact_big_integers_and_its_reward() -> None:
    env = ToolsEnvironment([calculator_tool()], reward=exact_answer)
    row = {"prompt": "What is 123456789 * 987654321?", "reference": 121932631112635269}
    assert env.reset(row) == [{"role": "user", "content": row["prompt"]}]
    first = env.step("Let me compute. " + call("calculator", expression="123456789 * 987654321"))
    assert first.messages == [
        {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "121932631112635269"}
    ]
    assert (first.reward, first.done) == (0.0, False)
    last = env.step("The product is 121932631112635269")
    assert (last.messages, last.reward, last.done) == ([], 1.0, True)
    assert last.info | {"tokens": 0} == {
        "turns": 2, "tokens": 0, "tool_calls": 1, "tool_calls_by_tool": {"calculator": 1}, "tool_errors": {},
        "tool_timeouts": {}, "truncated": None,
    }  # fmt: skip
    with pytest.raises(RayftError, match=r"episode that has ended .* call reset\(row\)"):
        env.step("more")


def _hangs() -> str:
    """Wait forever (for an event nobody sets)."""
    threading.Event().wait()
    return "never"


def _raises(text: str) -> str:
    """Fail on purpose."""
    raise KeyError(text)


def test_every_failure_of_a_call_or_a_tool_is_answered_counted_and_the_episode_goes_on() -> None:
    tools = [calculator_tool(), tool_from_function(_hangs, name="hangs"), tool_from_function(_raises, name="raises")]
    env = ToolsEnvironment(tools, reward=exact_answer, limits=EpisodeLimits(max_tool_calls=7, tool_timeout_s=0.3))
    env.reset({"prompt": "q", "reference": 4})
    bad = env.step(
        "<tool_call>{not json</tool_call>"
        + call("nope", x=1)
        + call("calculator", expression=7)  # a number where text is due
        + call("calculator")  # no expression
        + call("calculator", expression="__import__('os').system('ls')")  # refused by the calculator
    )
    assert [m["content"].split(":")[0] for m in bad.messages] == ["Error"] * 5 and not bad.done
    assert "not JSON" in bad.messages[0]["content"] and "no tool named 'nope'" in bad.messages[1]["content"]
    assert "bad arguments for calculator: expression: Input should be a valid string" in bad.messages[2]["content"]
    assert "expression: Field required" in bad.messages[3]["content"]
    assert "unsupported Call" in bad.messages[4]["content"]
    more = env.step(call("hangs") + call("raises", text="boom") + call("calculator", expression="2+2"))
    assert [m["content"] for m in more.messages] == [
        "Error: hangs did not answer within 0.3 s", "Error: raises failed: KeyError: 'boom'",
        "Error: this episode's 7 tool calls are used up; answer without tools",
    ]  # fmt: skip
    end = env.step("4")
    assert (end.reward, end.done) == (1.0, True)
    assert end.info["tool_calls_by_tool"] == {"<malformed>": 1, "<unknown>": 1, "calculator": 4, "hangs": 1,
                                              "raises": 1}  # fmt: skip
    assert end.info["tool_errors"] == {"<malformed>": 1, "<unknown>": 1, "calculator": 4, "raises": 1}
    assert end.info["tool_timeouts"] == {"hangs": 1}


def test_an_episode_is_cut_at_its_turn_and_token_limits_with_reward_0() -> None:
    looping = [call("calculator", expression="1+1")] * 5
    env = ToolsEnvironment([calculator_tool()], reward=lambda a, r: 1.0, limits=EpisodeLimits(max_turns=3))
    steps = play(env, {"prompt": "q"}, looping)
    assert len(steps) == 3 and steps[-1].done and steps[-1].reward == 0.0
    assert steps[-1].info["truncated"] == "turns" and steps[-1].info["tool_calls"] == 3
    short = ToolsEnvironment([calculator_tool()], reward=lambda a, r: 1.0, limits=EpisodeLimits(max_tokens=12),
                             count_tokens=len)  # fmt: skip
    steps = play(short, {"prompt": "q"}, looping)
    assert steps[-1].done and steps[-1].info["truncated"] == "tokens" and steps[-1].reward == 0.0


def test_a_reward_function_that_fails_scores_0_and_says_why() -> None:
    env = ToolsEnvironment([], reward=lambda answer, row: float(row["missing"]))
    env.reset({"prompt": "q"})
    end = env.step("42")
    assert (end.done, end.reward, end.info["reward_error"]) == (True, 0.0, "KeyError: 'missing'")


def test_a_row_without_a_prompt_is_a_clear_error() -> None:
    with pytest.raises(RayftError, match=r"needs 'messages' \(a list\) or 'prompt' \(text\); its keys: \['question'\]"):
        ToolsEnvironment([]).reset({"question": "q"})


def test_the_schema_is_derived_from_the_typed_function_and_validates_its_arguments() -> None:
    def lookup(city: Annotated[str, Field(description="The city's name")], days: int = 1, units: str = "metric") -> str:
        """The weather forecast of a city.

        More text that is not the description."""
        return f"{city}:{days}:{units}"

    tool = tool_from_function(lookup)
    assert tool.schema == {"type": "function", "function": {
        "name": "lookup", "description": "The weather forecast of a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "days": {"type": "integer", "default": 1}, "units": {"type": "string", "default": "metric"},
        }},
    }}  # fmt: skip
    assert call_tool(tool, {"city": "Oslo", "days": "3"}, {}, 5.0).text == "Oslo:3:metric"  # lax like OpenAI's
    assert call_tool(tool, {"city": "Oslo", "weeks": 2}, {}, 5.0).status == "error"  # an unknown argument
    explicit = {"type": "object", "properties": {"city": {"type": "string"}}}
    assert tool_from_function(lookup, name="weather", parameters=explicit).schema["function"]["parameters"] == explicit


@pytest.mark.parametrize(
    ("expression", "result"),
    [("123456789 ** 5", str(123456789**5)), ("7 / 2", "3.5"), ("10 / 5", "2"), ("-(2 + 3) * 4 % 7", "1"),
     ("sqrt(16) + abs(-2)", "6"), ("max(3, 9, 4) // 2", "4"), (f"{10**40} / {10**20}", str(10**20))],
)  # fmt: skip
def test_the_calculator_is_exact(expression: str, result: str) -> None:
    assert calculate(expression) == result


@pytest.mark.parametrize(
    ("expression", "error"),
    [("9 ** 9 ** 9", "over 100000 bits"), ("1 / 0", "division by zero"), ("'a' * 3", "unsupported Constant"),
     ("x + 1", "unsupported Name"), ("(1).__class__", "unsupported Attribute"), ("2 +", "not an arithmetic"),
     ("(-8) ** 0.5", "not a real number"), ("1" * 3000, "at most 2000")],
)  # fmt: skip
def test_the_calculator_refuses_what_is_not_arithmetic(expression: str, error: str) -> None:
    with pytest.raises(CalculatorError, match=error):
        calculate(expression)


def test_the_sql_tool_queries_the_rows_own_table_read_only() -> None:
    example = next(iter_sql_examples(1))
    env = ToolsEnvironment([sql_tool()], reward=lambda answer, row: 0.0)
    env.reset({"prompt": example["input"], "table": example["table"]})
    table = json.loads(example["table"])
    step = env.step(call("sql_query", query=f"SELECT COUNT(*) FROM {table['name']}")
                    + call("sql_query", query=f"DELETE FROM {table['name']}")
                    + call("sql_query", query=f"SELECT COUNT(*) FROM {table['name']}"))  # fmt: skip
    counts = [m["content"] for m in step.messages]
    assert counts[0] == counts[2] == f"[{len(table['rows'])}]"
    assert "not authorized" in counts[1] and step.info["tool_errors"] == {"sql_query": 1}
    env.reset({"prompt": "no table"})
    assert "no 'table' column" in env.step(call("sql_query", query="SELECT 1")).messages[0]["content"]


def test_the_python_tool_runs_in_the_sandbox_and_a_hang_is_a_counted_timeout() -> None:
    env = ToolsEnvironment([python_tool(Limits(wall_s=3.0, cpu_s=3.0, memory_mb=512))])
    env.reset({"prompt": "q"})
    connect = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)"
    step = env.step(call("python", code="print(sum(range(10)))") + call("python", code="while True: pass")
                    + call("python", code=connect))  # fmt: skip
    assert step.messages[0]["content"] == "45\n"
    assert "timed out after 3 s" in step.messages[1]["content"]
    assert "Error: python failed" in step.messages[2]["content"] and "OSError" in step.messages[2]["content"]
    assert step.info["tool_timeouts"] == {"python": 1} and step.info["tool_errors"] == {"python": 1}


def test_tool_calls_are_read_in_order_with_bad_blocks_kept() -> None:
    text = 'a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call> b <tool_call>[1]</tool_call>'
    first, second = parse_tool_calls(text)
    assert (first.name, first.arguments) == ("f", {"x": 1})  # type: ignore[union-attr]
    assert "must be a JSON object" in second.reason  # type: ignore[union-attr]
    assert parse_tool_calls("a final answer") == []


USER_ENV = '''
from rayft.environments import StepResult


class Echo:
    """Ends after `turns` turns; the reward is the number of turns whose text said 'yes'."""

    def __init__(self, turns=2):
        self.turns = turns

    def reset(self, row):
        self.seen, self.yes = 0, 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, model_turn):
        self.seen += 1
        self.yes += "yes" in model_turn
        done = self.seen >= self.turns
        return StepResult([] if done else [{"role": "user", "content": "again"}], float(self.yes), done, {})


class NoStep:
    def reset(self, row):
        return []
'''


def test_a_users_environment_class_is_loaded_from_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_envs.py").write_text(textwrap.dedent(USER_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)
    env = build_environment(EnvironmentConfig(type="my_envs:Echo", options={"turns": 3}))
    steps = play(env, {"prompt": "hi"}, ["yes", "no", "yes", "unused"])
    assert [s.done for s in steps] == [False, False, True] and steps[-1].reward == 2.0
    with pytest.raises(ConfigError, match=r"my_envs:NoStep.*lacks step of rayft.environments.Environment"):
        build_environment(EnvironmentConfig(type="my_envs:NoStep"))
    with pytest.raises(ConfigError, match=r"constructing it with train.rl.environment.options failed"):
        build_environment(EnvironmentConfig(type="my_envs:Echo", options={"nope": 1}))
    with pytest.raises(ConfigError, match=r"cannot import module 'no_such_envs'"):
        build_environment(EnvironmentConfig(type="no_such_envs:Echo"))


def test_the_config_builds_the_tools_environment_and_refuses_what_it_cannot_honour() -> None:
    env = build_environment(EnvironmentConfig(tools=["calculator", "python"], max_turns=2, tool_timeout_s=4.0))
    assert isinstance(env, ToolsEnvironment) and list(env.tools) == ["calculator", "python"]
    assert env.limits == EpisodeLimits(max_turns=2, max_tool_calls=16, max_tokens=4096, tool_timeout_s=4.0)
    with pytest.raises(ValidationError, match="neither 'tools' nor 'package.module:Class'"):
        EnvironmentConfig(type="gym")
    with pytest.raises(ValidationError, match="only type 'tools' reads it"):
        EnvironmentConfig(type="a:B", tools=["sql"])
    assert RlConfig(environment=EnvironmentConfig()).environment == EnvironmentConfig()  # GRPO runs episodes
    actors = {"placement": "actors", "engine": "vllm"}
    with pytest.raises(ValidationError, match="episodes are sampled with HF generate"):
        RlConfig(environment=EnvironmentConfig(), rollout=actors)
