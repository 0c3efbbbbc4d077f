"""Episodes driven a turn at a time for many rows (rayft.environments.runner) by a scripted model, and the
pure parts of evaluating in an environment: the rows episodes start from, the tools taken away, the
episodes' figures, the config's refusals, and the scores an episode adds."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from pydantic import ValidationError

from rayft.config import RayftConfig
from rayft.config.environment import EnvironmentConfig
from rayft.config.evaluation import EvalConfig
from rayft.environments import StepResult, ToolsEnvironment
from rayft.environments.builtin import calculator_tool
from rayft.environments.evaluate import EpisodeTally, check_without_tools, episode_row, make_environment
from rayft.environments.runner import as_generation, assistant_message, run_episodes, start_episode, take_turn
from rayft.errors import ConfigError
from rayft.evaluation.report import episodes_text
from rayft.evaluation.runner import Example, ScoreTally
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation, Prompt, ToolChat, prompt_tools


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedModel:
    """Calls the calculator on the question's expression, then answers with the tool's result; records
    every batch it was asked (the prompts are the conversations so far)."""

    def __init__(self) -> None:
        self.batches: list[list[Prompt]] = []

    def __call__(self, prompts: list[Prompt]) -> list[Generation]:
        self.batches.append(prompts)
        return [Generation(self.turn(p), num_generated_tokens=3) for p in prompts]

    @staticmethod
    def turn(prompt: Prompt) -> str:
        assert isinstance(prompt, list)
        last = prompt[-1]
        if last["role"] == "tool":
            return f"The answer is {last['content']}"
        expression = str(last["content"]).removeprefix("Compute ")
        return "Let me compute. " + call("calculator", expression=expression) if "*" in expression else "no idea"


def calculator_env() -> ToolsEnvironment:
    return ToolsEnvironment([calculator_tool()])


def test_episodes_call_the_tool_read_its_result_and_answer_a_turn_of_every_episode_per_batch() -> None:
    model = ScriptedModel()
    rows = [{"prompt": "Compute 123456789 * 987654321"}, {"prompt": "Compute nothing"}]
    first, second = run_episodes(rows, calculator_env, model, max_turns=4)
    assert first.answer == "The answer is 121932631112635269" and first.done and first.error is None
    assert [m["role"] for m in first.messages] == ["user", "assistant", "tool", "assistant"]
    (sent,) = first.messages[1]["tool_calls"]
    assert sent["id"] == first.messages[2]["tool_call_id"] == "call_0"  # the result answers the call it names
    assert json.loads(sent["function"]["arguments"]) == {"expression": "123456789 * 987654321"}
    assert first.messages[1]["content"] == "Let me compute."
    assert second.answer == "no idea" and len(second.turns) == 1
    assert [len(batch) for batch in model.batches] == [2, 1]  # the finished episode is not asked again
    assert all(isinstance(p, ToolChat) and prompt_tools(p)[0]["function"]["name"] == "calculator"
               for batch in model.batches for p in batch)  # fmt: skip
    generation = as_generation(first)
    assert generation.text == first.answer and generation.num_generated_tokens == 6
    record = generation.extra["episode"]
    assert record["turns"] == 2 and record["tool_calls"] == 1 and record["tool_calls_by_tool"] == {"calculator": 1}
    assert record["tool_errors"] == 0 and record["truncated"] is None and record["error"] is None
    json.dumps(record)  # the record goes into JSON Lines as it is


def test_progress_hears_of_each_episode_as_it_ends_not_at_the_windows_end() -> None:
    model, ended = ScriptedModel(), []
    rows = [{"prompt": "Compute 2 * 3"}, {"prompt": "Compute nothing"}, {"question": "no prompt"}]
    environments = iter([calculator_env(), calculator_env(), Endless()])
    run_episodes(rows, lambda: next(environments), model, max_turns=4, on_finished=ended.append)
    # The row the environment refuses ends at once; the tool-less answer after one turn; the call after two.
    assert ended == [1, 1, 1] and len(model.batches) == 2


def test_a_failed_generation_ends_its_episode_only() -> None:
    def generate(prompts: list[Prompt]) -> list[Generation]:
        return [Generation("", finish_reason="error", error="out of memory"), *map(_answer, prompts[1:])]

    failed, fine = run_episodes([{"prompt": "a"}, {"prompt": "b"}], calculator_env, generate, max_turns=3)
    assert failed.error == "generation: out of memory" and as_generation(failed).finish_reason == "error"
    assert fine.error is None and fine.answer == "42"


def _answer(prompt: Prompt) -> Generation:
    return Generation("42")


class Endless:
    """A user environment that never ends an episode, and raises on a turn that says so."""

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if "prompt" not in row:
            raise ValueError("no prompt")
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, model_turn: str) -> StepResult:
        if "raise" in model_turn:
            raise RuntimeError("broken environment")
        return StepResult([{"role": "user", "content": "go on"}], 0.0, False, {})


def test_max_turns_bounds_an_environment_that_never_ends_and_failures_stay_in_their_episode() -> None:
    (bounded,) = run_episodes([{"prompt": "x"}], Endless, lambda ps: [Generation("more")] * len(ps), max_turns=3)
    assert len(bounded.turns) == 3 and bounded.done and bounded.info["truncated"] == "turns"
    refused = start_episode(Endless(), {"question": "no prompt here"})
    assert refused.done and refused.error == "reset: ValueError: no prompt"
    broken = start_episode(Endless(), {"prompt": "x"})
    take_turn(broken, Generation("raise"), max_turns=5)
    assert broken.done and broken.error == "step: RuntimeError: broken environment"


def test_a_turn_whose_call_cannot_be_read_stays_text() -> None:
    assert assistant_message("<tool_call>{not json</tool_call>") == {
        "role": "assistant", "content": "<tool_call>{not json</tool_call>"}  # fmt: skip
    assert assistant_message("just text") == {"role": "assistant", "content": "just text"}


def test_without_tools_the_same_episode_has_no_tool_list_and_a_call_is_answered_with_an_error() -> None:
    cfg = EnvironmentConfig(tools=["calculator"])
    model = ScriptedModel()
    (episode,) = run_episodes([{"prompt": "Compute 6 * 7"}], lambda: make_environment(cfg, tools=False), model,
                              max_turns=2)  # fmt: skip
    assert prompt_tools(model.batches[0][0]) == ()
    assert episode.messages[2]["content"].startswith("Error: no tool named 'calculator'")
    assert episode.info["tool_errors"] == {"<unknown>": 1} and episode.answer.startswith("The answer is Error")
    tally = EpisodeTally()
    tally.add([episode])
    summary = tally.summary(with_tools=False)
    assert summary["tool_errors"] == 1 and summary["truncated"] == 0 and summary["mean_turns"] == 2.0
    assert summary["tool_errors_by_tool"] == {"<unknown>": 1} and summary["with_tools"] is False
    assert episodes_text(summary) == ("1 episodes without tools: 2 turns and 1 tool calls each (<unknown> 1); 1 tool "
                                      "errors, 0 timeouts, 0 truncated, 0 failed")  # fmt: skip


def test_an_episode_row_holds_the_examples_prompt_reference_and_table() -> None:
    cfg = EnvironmentConfig(tools=["sql"], table_column="tbl")
    chat = Example("d:0", "q?", "7", [{"role": "user", "content": "q?"}], table='{"name": "t"}')
    expected = {"id": "d:0", "question": "q?", "answer": "7", "messages": [{"role": "user", "content": "q?"}]}
    assert episode_row(chat, cfg) == expected | {"tbl": '{"name": "t"}'}
    assert episode_row(Example("d:1", "q", "1", "Question: q\nAnswer:"), cfg)["prompt"] == "Question: q\nAnswer:"


def test_a_tool_chat_keeps_its_tools_through_pickling() -> None:
    prompt = ToolChat([{"role": "user", "content": "hi"}], [{"type": "function", "function": {"name": "f"}}])
    copy = pickle.loads(pickle.dumps(prompt))
    assert isinstance(copy, ToolChat) and copy == prompt and copy.tools == prompt.tools
    assert prompt_tools("text") == () and prompt_tools([{"role": "user", "content": "x"}]) == ()


def test_the_episode_reward_is_one_more_score_beside_the_tasks() -> None:
    task = build_task(EvalConfig(task="exact_match"))
    tally = ScoreTally(task)
    examples = [Example(f"d:{i}", "q", "4", "q") for i in range(2)]
    scored = tally.add(examples, [Generation("4"), Generation("5")], [{"reward": 0.5}, {"reward": 1.0}])
    assert [s.scores["reward"] for s in scored] == [0.5, 1.0]
    assert list(tally.values["reward"]) == [0.5, 1.0] and list(tally.values["exact_match"]) == [1.0, 0.0]


def test_the_config_refuses_what_an_environment_eval_cannot_do() -> None:
    with pytest.raises(ValidationError, match="eval.without_tools takes the tools"):
        RayftConfig.model_validate({"eval": {"without_tools": ["plain"]}})
    with pytest.raises(ValidationError, match="eval.without_tools takes the tools"):
        RayftConfig.model_validate({"eval": {"environment": {"type": "pkg.mod:Env"}, "without_tools": ["x"]}})
    with pytest.raises(ValidationError, match="backend 'hf' or 'openai'"):
        RayftConfig.model_validate({"eval": {"environment": {}, "backend": "vllm"}})
    ev = RayftConfig.model_validate({"eval": {"environment": {}, "without_tools": ["plain"]}}).eval
    check_without_tools(ev, ["tools", "plain"])
    with pytest.raises(ConfigError, match=r"eval.without_tools names \['plain'\], not models evaluated here"):
        check_without_tools(ev, ["model"])


def test_chat_tools_are_the_built_in_ones_and_a_bad_name_is_one_line() -> None:
    from rayft.recipes.chat import tools_environment

    assert [s["function"]["name"] for s in tools_environment(["calculator", "python"]).schemas] == [
        "calculator", "python"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"--tool \['nope'\]: .*the tools are calculator, sql and python"):
        tools_environment(["nope"])
