"""Multi-turn rollouts, their pure parts and one batch of episodes on a tiny random model: the text appended
after a turn makes the sequence the chat template renders for the whole conversation, masks cover the
sampled tokens only, an episode's rewards and figures, and a batch of episodes whose tools answer well,
badly and not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.config.environment import EnvironmentConfig
from rayft.config.rl import RlConfig
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.tokenize import render_chat
from rayft.evaluation.rewards import Scores
from rayft.models.registry import CHATML_TEMPLATE
from rayft.training.methods.rl.episodes import (
    EpisodeRunner,
    TurnRenderer,
    episode_figure_names,
    episode_figures,
    episode_scores,
    episode_sums,
    tool_names,
    turn_renderer,
)
from rayft.training.methods.rl.tool_steps import ThreadStepRunner

TEMPLATES = Path(__file__).parents[1] / "support" / "chat_templates"
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Arithmetic.",
                                               "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
TURN = 'Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
RESULTS = [
    {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "4"},
    {"role": "tool", "tool_call_id": "call_1", "name": "calculator", "content": "Error: bad arguments"},
]


def renderer(template: str, eos: str, **kwargs: str) -> TurnRenderer:
    def render(messages: Any, generation_prompt: bool) -> str:
        return render_chat(template, kwargs, messages, generation_prompt=generation_prompt)

    return TurnRenderer(render, eos)


# (template, end-of-sequence text): ChatML renders no tools (rayft's default format), Qwen2.5's and Llama 3.1's do.
@pytest.mark.parametrize(("name", "eos"), [(None, "<|im_end|>"), ("qwen2_5", "<|im_end|>"),
                                           ("llama3_1", "<|eot_id|>")])  # fmt: skip
def test_prompt_turn_and_answer_are_the_conversation_the_template_renders(name: str | None, eos: str) -> None:
    template = CHATML_TEMPLATE if name is None else (TEMPLATES / f"{name}.jinja").read_text()
    kwargs = {"bos_token": "<|begin_of_text|>"} if name == "llama3_1" else {}
    turns = renderer(template, eos, **kwargs)
    user = [{"role": "user", "content": "What is 2 + 2?"}]
    prompt = render_chat(template, kwargs, user, tools=[CALCULATOR], generation_prompt=True)
    whole = render_chat(template, kwargs, [*user, {"role": "assistant", "content": TURN}, *RESULTS],
                        tools=[CALCULATOR], generation_prompt=True)  # fmt: skip
    # The model sampled the turn and its end-of-sequence token; the environment's answer continues from there.
    assert prompt + TURN + eos + turns.answer_text(TURN, True, RESULTS) == whole
    # A turn cut before its end (max_new_tokens) gets the template's end of turn from the environment.
    assert prompt + TURN + turns.answer_text(TURN, False, RESULTS) == whole


def test_the_default_format_answers_each_result_in_a_tool_response_block() -> None:
    text = renderer(CHATML_TEMPLATE, "<|im_end|>").answer_text(TURN, True, RESULTS)
    assert text == ("\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\nError: bad arguments\n"
                    "</tool_response><|im_end|>\n<|im_start|>assistant\n")  # fmt: skip


def test_an_episodes_reward_is_its_answers_plus_the_environments_and_a_cut_episode_scores_the_environments() -> None:
    scores = Scores([1.0, 0.5, 1.0], {"math": [1.0, 0.5, 1.0]}, {"math": 0})
    records = [record(env_reward=0.0), record(env_reward=0.25), record(truncated="turns", env_reward=0.0)]
    out = episode_scores(scores, records)
    assert out.total == [1.0, 0.75, 0.0] and out.by_function == {"math": [1.0, 0.5, 0.0]}


def record(**changes: Any) -> dict[str, Any]:
    base = {"turns": 2, "truncated": None, "env_reward": 0.0, "model_tokens": 10, "tool_tokens": 6,
            "tool_calls": {"calculator": 2, "<malformed>": 1}, "tool_errors": 1, "tool_timeouts": 0,
            "env_failure": None, "prefill_tokens": 20}  # fmt: skip
    return base | changes


def test_episode_figures_are_means_per_episode_and_counts() -> None:
    names = tool_names(EnvironmentConfig())
    assert names == ["calculator", "<malformed>", "<unknown>"]
    records = [record(), record(turns=4, truncated="tokens", tool_timeouts=2, tool_calls={"calculator": 4})]
    total = dict.fromkeys(episode_figure_names(names), 0.0) | episode_sums(records, names)
    total |= {"time/rollout_sample_s": 3.0, "time/rollout_tools_s": 1.0}
    figures = episode_figures(total, names, world_size=2)
    assert figures["rl/episode/turns"] == 3.0 and figures["rl/episode/tool_calls"] == 3.5
    assert figures["rl/episode/tool_calls/calculator"] == 3.0 and figures["rl/episode/tool_calls/malformed"] == 0.5
    assert figures["rl/episode/tool_errors"] == 2 and figures["rl/episode/tool_timeouts"] == 2
    assert figures["rl/episode/truncated"] == 1 and figures["rl/episode/model_tokens"] == 10
    assert figures["rl/episode/prefill_tokens"] == 20
    assert figures["rl/episode/sample_s"] == 1.5 and figures["rl/episode/tool_s"] == 0.5
    assert tool_names(None) == [] and tool_names(EnvironmentConfig(tools=["sql"]))[0] == "sql_query"
    scripted = tool_names(EnvironmentConfig(type="rayft.testing.environments:ScriptedCalls"))
    assert scripted == ["calculator", "hang", "<malformed>", "<unknown>"]  # a user's class that is a tools environment


def test_masked_labels_and_behaviour_log_probabilities_follow_the_sampled_tokens() -> None:
    import torch

    from rayft.data.collate import collate
    from rayft.training.methods.rl.batches import behaviour_rows, masked

    assert masked([5, 6, 7, 8], [1, 0, 0, 1]) == [5, IGNORE_INDEX, IGNORE_INDEX, 8]
    unit = {"input_ids": [1, 2, 5, 6, 7, 8], "labels": [IGNORE_INDEX] * 2 + masked([5, 6, 7, 8], [1, 0, 0, 1]),
            "position_ids": range(6), "sample_ids": [0]}  # fmt: skip
    rows = collate([unit], 0, 1)
    out = behaviour_rows([unit], [[-0.5, -0.25]], rows)
    # Target t predicts token t + 1: token 5 (position 2) is target 1, token 8 (position 5) is target 4.
    assert out.tolist() == [[0.0, -0.5, 0.0, 0.0, -0.25]]
    assert torch.equal(rows.labels[0, 1:] != IGNORE_INDEX, out[0] != 0)


def test_a_batch_of_episodes_appends_answers_to_the_sampled_ids_and_counts_what_the_tools_did(
    tiny_model_dir: Path,
) -> None:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_causal_lm, load_tokenizer
    from rayft.training.methods.rl.sampling import Sampler

    env = EnvironmentConfig(type="rayft.testing.environments:ScriptedCalls", options={"tool_timeout_s": 0.5},
                            max_turns=3, max_tokens=400)  # fmt: skip
    settings = RlConfig(group_size=2, max_new_tokens=6, environment=env)
    tokenizer = load_tokenizer(ModelConfig(name=str(tiny_model_dir)))
    model = load_causal_lm(ModelConfig(name=str(tiny_model_dir)), "cpu")
    sampler = Sampler(settings, tokenizer, "sdpa")
    runner = EpisodeRunner(sampler, env, ThreadStepRunner(), turn_renderer(tokenizer))
    sampled_turns: list[list[int]] = []
    original = sampler.sample_rows

    def recording(inner: Any, rows: list[list[int]], **kwargs: Any) -> tuple[list[list[int]], float]:
        out = original(inner, rows, **kwargs)
        sampled_turns.extend(out[0])
        return out

    object.__setattr__(sampler, "sample_rows", recording)  # a spy: the real sampler samples
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    done = runner.run(model, [tokenizer.encode(text, add_special_tokens=False)], [{}], 2, seed=7)
    assert done.masks is not None and done.episodes is not None and len(done.token_ids) == 2
    for completion, mask, episode in zip(done.token_ids, done.masks, done.episodes, strict=True):
        runs = split_runs(completion, mask)
        # Each run of trained tokens is one turn exactly as sampled; between them, the environment's answers.
        assert [keep for _, keep in runs] == [1, 0, 1, 0, 1]
        assert all(ids in sampled_turns for ids, keep in runs if keep)
        answers = [tokenizer.decode(ids) for ids, keep in runs if not keep]
        assert len(answers) == 2 and all("<tool_response>" in a and a.endswith("<|im_start|>assistant\n")
                                         for a in answers)  # fmt: skip
        assert "Error: bad arguments for calculator" in answers[0] and "121932631112635269" in answers[0]
        assert "did not answer within 0.5 s" in answers[0]
        assert episode["turns"] == 3 and episode["tool_calls"] == {"calculator": 3, "hang": 1}
        assert episode["tool_errors"] == 1 and episode["tool_timeouts"] == 1 and episode["truncated"] is None
        assert episode["model_tokens"] == sum(mask) and episode["tool_tokens"] == len(mask) - sum(mask)
    assert done.generated_tokens == sum(sum(m) for m in done.masks)


def split_runs(ids: list[int], mask: list[int]) -> list[tuple[list[int], int]]:
    """``ids`` as runs of equal mask values: (ids, 1) sampled, (ids, 0) appended."""
    runs: list[tuple[list[int], int]] = []
    for token, keep in zip(ids, mask, strict=True):
        if runs and runs[-1][1] == keep:
            runs[-1][0].append(token)
        else:
            runs.append(([token], keep))
    return runs


def test_the_reports_rl_section_draws_the_episodes_when_the_run_had_them() -> None:
    from rayft.pipeline.report import _rl_section

    single = [{"step": s, "rl/reward": 0.1 * s, "rl/pass@1": 0.0} for s in (1, 2)]
    episodes = [
        r | {"rl/episode/turns": 2.0, "rl/episode/tool_calls": 1.5, "rl/episode/tool_errors": 1.0} for r in single
    ]
    assert "turns per episode" not in _rl_section(single, {})
    drawn = _rl_section(episodes, {})
    assert "turns per episode" in drawn and "tool calls per episode" in drawn and "tool errors" in drawn
