"""The KV cache kept across an episode's turns: a batch of episodes that end at different turns gives, greedy, the
same tokens and the same next-token distributions with the cache as with a whole prefill every turn, and
prefills each answer token once instead of the whole conversation every turn."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rayft.config.environment import EnvironmentConfig
from rayft.config.rl import RlConfig
from rayft.environments.episode import Environment, Message
from rayft.testing.environments import GOOD, ScriptedCalls
from rayft.training.methods.rl.episodes import EpisodeRunner, turn_renderer
from rayft.training.methods.rl.tool_steps import ThreadStepRunner


class CallsByRow(ScriptedCalls):
    """The scripted calculator environment whose row says how many turns call it (then the episode ends)."""

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.script = [GOOD] * int(row["calls"])
        return super().reset(row)


class RowRunner(EpisodeRunner):
    """The episode runner with :class:`CallsByRow` environments."""

    def new_env(self) -> Environment:
        return CallsByRow(max_turns=self.cfg.max_turns)


def play(model_dir: Path, keep: bool, distributions: list[Any]) -> tuple[Any, Any, list[int]]:
    """Greedy episodes of two prompts of different lengths (group 2): the first's episodes end after 2 turns,
    the second's after 3. Each forward's last-position log-probabilities are appended to ``distributions``. Returns
    the completions, the model and each episode's prompt length."""
    import torch

    from rayft.config import ModelConfig
    from rayft.models.loading import load_causal_lm, load_tokenizer
    from rayft.training.methods.rl.sampling import Sampler

    env = EnvironmentConfig(max_turns=4, max_tokens=400, keep_kv_cache=keep)
    tokenizer = load_tokenizer(ModelConfig(name=str(model_dir)))
    model = load_causal_lm(ModelConfig(name=str(model_dir)), "cpu")
    sampler = Sampler(RlConfig(group_size=2, max_new_tokens=5, environment=env), tokenizer, "sdpa")
    runner = RowRunner(sampler, env, ThreadStepRunner(), turn_renderer(tokenizer))

    def record(module: Any, args: Any, output: Any) -> None:
        distributions.append(torch.log_softmax(output.logits[:, -1].double(), dim=-1))

    model.register_forward_hook(record)
    prompts = [
        [{"role": "user", "content": "2 + 2?"}],
        [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "SELECT"}],
    ]
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
           for p in prompts]  # fmt: skip
    done = runner.run(model, ids, [{"calls": 1}, {"calls": 2}], 2, seed=None)
    return done, model, [len(i) for i in ids for _ in range(2)]


def test_the_kept_cache_gives_the_same_turns_and_distributions_and_prefills_each_answer_once(
    tiny_model_dir: Path,
) -> None:
    from rayft.training.methods.rl.turn_cache import keeps_cache

    with_cache: list[Any] = []
    without: list[Any] = []
    kept, model, prompt_lengths = play(tiny_model_dir, True, with_cache)
    fresh, _, _ = play(tiny_model_dir, False, without)
    assert keeps_cache(model) and kept.episodes is not None and fresh.episodes is not None
    assert [e["turns"] for e in kept.episodes] == [2, 2, 3, 3]  # the first prompt's episodes leave the cache early
    assert kept.token_ids == fresh.token_ids and kept.masks == fresh.masks and kept.texts == fresh.texts
    # One forward per prefill and per decoding step, the same in both; each row's next-token log-probabilities
    # agree to float32 rounding. The cache concatenates keys that one fresh prefill computes in one matmul: the
    # attention sums (at most 400 keys, 32-wide heads) round in another order, each layer's relative error a few
    # eps32 times the reduction's length, 2 layers and the head on O(1) logits: 1e-4 bounds it with room.
    assert len(with_cache) == len(without)
    for cached, whole in zip(with_cache, without, strict=True):
        assert cached.shape == whole.shape
        assert (cached - whole).abs().max().item() < 1e-4
    for kept_record, fresh_record, mask, prompt in zip(kept.episodes, fresh.episodes, kept.masks, prompt_lengths,
                                                       strict=True):  # fmt: skip
        answers = kept_record["tool_tokens"]
        # Without the cache each turn prefills the whole conversation so far: the prompt, then more every turn.
        starts = [prompt + i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        assert fresh_record["prefill_tokens"] == sum(starts)
        # With it: the prompt and each answer once, and at most the last sampled token of each earlier turn
        # (generate never feeds a turn's last token back).
        turns = kept_record["turns"]
        assert prompt + answers <= kept_record["prefill_tokens"] <= prompt + answers + turns - 1
        assert kept_record["prefill_tokens"] < fresh_record["prefill_tokens"]


def test_a_model_with_sliding_window_or_linear_layers_prefills_every_turn() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from rayft.training.methods.rl.turn_cache import keeps_cache

    shape = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    torch.manual_seed(0)
    assert keeps_cache(LlamaForCausalLM(LlamaConfig(**shape)))
    assert not keeps_cache(MistralForCausalLM(MistralConfig(**shape, sliding_window=8)))


@pytest.mark.parametrize("change", ["token", "shorter"])
def test_a_conversation_that_does_not_continue_the_cache_starts_it_afresh(tiny_model_dir: Path, change: str) -> None:
    from transformers import GenerationConfig

    from rayft.config import ModelConfig
    from rayft.models.loading import load_causal_lm
    from rayft.training.methods.rl.turn_cache import TurnCache

    model = load_causal_lm(ModelConfig(name=str(tiny_model_dir)), "cpu")
    cache = TurnCache()
    rows = [[5, 6, 7], [8, 9]]
    cache.select([0, 1])

    def config() -> GenerationConfig:
        return GenerationConfig(do_sample=False, max_new_tokens=3, pad_token_id=0, eos_token_id=[1])

    turns = cache.generate(model, rows, config(), 0, list)
    assert cache.prefilled == [3, 2]
    follow = [row + turn + [10, 11] for row, turn in zip(rows, turns, strict=True)]
    again = cache.generate(model, follow, config(), 0, list)
    assert cache.prefilled == [3, 3]  # the answer and the turn's last token, never fed by generate
    grown = [row + turn for row, turn in zip(follow, again, strict=True)]
    changed = [[99, *grown[0][1:]], grown[1]] if change == "token" else [grown[0][:2], grown[1]]
    cache.generate(model, changed, config(), 0, list)
    assert cache.prefilled == [len(changed[0]), len(changed[1])]
