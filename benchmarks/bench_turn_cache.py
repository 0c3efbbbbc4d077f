"""Multi-turn episodes with and without the KV cache kept between turns (``train.rl.environment.keep_kv_cache``):
sampling seconds and tokens prefilled per episode, in one run, as a ratio.

A random Llama built from a config (no download) samples 4 prompts x ``--group`` episodes of ``--turns`` model
turns each on CPU; the environment is rayft.testing's ScriptedCalls (the calculator tools environment with a
well-formed call appended to every turn but the last, so that every episode runs all its turns and both arms
do the same work). Each arm runs ``--repeats`` times, alternating, and the medians are printed.

    .venv/bin/python benchmarks/bench_turn_cache.py [--hidden 256] [--layers 4] [--group 4] [--turns 4]
        [--max-new-tokens 32] [--system-words 300] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--group", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--turns", type=int, default=4, help="model turns per episode")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per model turn")
    parser.add_argument("--system-words", type=int, default=300, help="words of the shared system prompt")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from rayft.config import ModelConfig
    from rayft.config.environment import EnvironmentConfig
    from rayft.config.rl import RlConfig
    from rayft.models.loading import load_causal_lm, load_tokenizer
    from rayft.testing import build_tiny_model
    from rayft.testing.environments import GOOD, ScriptedCalls
    from rayft.training.methods.rl.episodes import EpisodeRunner, turn_renderer
    from rayft.training.methods.rl.sampling import Sampler
    from rayft.training.methods.rl.tool_steps import ThreadStepRunner

    torch.set_num_threads(args.threads)
    model_dir = Path(tempfile.mkdtemp())
    build_tiny_model(model_dir, hidden_size=args.hidden, num_layers=args.layers, num_heads=4)
    tokenizer = load_tokenizer(ModelConfig(name=str(model_dir)))
    model = load_causal_lm(ModelConfig(name=str(model_dir)), "cpu")

    class Calls(ScriptedCalls):
        def __init__(self) -> None:
            super().__init__(script=[GOOD] * (args.turns - 1), max_turns=args.turns)

    class Runner(EpisodeRunner):
        def new_env(self) -> Any:
            return Calls()

    system = " ".join(["You are a helpful assistant."] * (args.system_words // 5))
    conversations = [[{"role": "system", "content": system}, {"role": "user", "content": f"{i} + {i}?"}]
                     for i in range(4)]  # fmt: skip
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
               for c in conversations]  # fmt: skip
    seconds: dict[bool, list[float]] = {False: [], True: []}
    prefilled: dict[bool, float] = {}
    turns: dict[bool, float] = {}
    for _ in range(args.repeats):
        for keep in (False, True):
            env = EnvironmentConfig(max_turns=args.turns, max_tokens=8192, keep_kv_cache=keep)
            sampler = Sampler(RlConfig(group_size=args.group, max_new_tokens=args.max_new_tokens, environment=env),
                              tokenizer, "sdpa")  # fmt: skip
            runner = Runner(sampler, env, ThreadStepRunner(), turn_renderer(tokenizer))
            done = runner.run(model, prompts, [{}] * len(prompts), args.group, seed=3)
            seconds[keep].append(done.seconds)
            prefilled[keep] = statistics.mean(r["prefill_tokens"] for r in done.episodes)
            turns[keep] = statistics.mean(r["turns"] for r in done.episodes)
    print(f"multi-turn episodes, random Llama hidden {args.hidden} x {args.layers} layers, {args.threads} thread(s): "
          f"4 prompts x {args.group} episodes, {args.turns} turns of at most {args.max_new_tokens} tokens, "
          f"{args.repeats} runs per arm (medians)")  # fmt: skip
    print(f"{'keep_kv_cache':<15}{'sampling s':>12}{'prefilled tokens/episode':>26}{'turns/episode':>15}")
    for keep in (False, True):
        print(f"{str(keep).lower():<15}{statistics.median(seconds[keep]):>12.2f}{prefilled[keep]:>26.0f}"
              f"{turns[keep]:>15.2f}")  # fmt: skip
    base, kept = statistics.median(seconds[False]), statistics.median(seconds[True])
    print(
        f"ratios kept / not kept: sampling time {kept / base:.2f}x, prefilled tokens "
        f"{prefilled[True] / prefilled[False]:.2f}x"
    )
    print("command: " + " ".join([".venv/bin/python", "benchmarks/bench_turn_cache.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
