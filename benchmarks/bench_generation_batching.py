"""HF backend generation: batched (batch 16, left padding) vs one prompt at a time, same model.

Counts only real generated tokens (up to and including EOS, never padding). Greedy decoding, the
same 16 chat prompts in both arms; runs alternate A B A B after one warm-up of each arm; medians
with min-max. Default model: the built-in SmolLM2-135M-Instruct (offline).

    .venv/bin/python benchmarks/bench_generation_batching.py [--model smollm2-135m-instruct]
        [--prompts 16] [--max-new-tokens 64] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

QUESTIONS = [
    "A baker makes {n} loaves a day. How many loaves does she make in {d} days?",
    "Tom has {n} marbles and gives {d} away. How many are left?",
    "A train travels {n} km per hour for {d} hours. How far does it go?",
    "Sara reads {n} pages a day. How many days does a {d}00-page book take?",
]


def prompts(count: int) -> list[list[dict[str, str]]]:
    out = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)].format(n=3 + 7 * i % 40, d=2 + i % 9)
        out.append([{"role": "user", "content": f"Solve step by step: {question}"}])
    return out


def run_arm(backend: object, batch: list[list[dict[str, str]]], batch_size: int, max_new_tokens: int) -> float:
    from rayft.generation.backend import SamplingParams
    from rayft.generation.hf import HFBackend

    assert isinstance(backend, HFBackend)
    backend.batch_size = batch_size
    started = time.perf_counter()
    generations = backend.generate(batch, SamplingParams(max_new_tokens=max_new_tokens))
    elapsed = time.perf_counter() - started
    assert all(g.error is None for g in generations)
    return sum(g.num_generated_tokens for g in generations) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from rayft.config.model import ModelConfig
    from rayft.generation.hf import HFBackend

    torch.set_num_threads(args.threads)
    backend = HFBackend(ModelConfig(name=args.model), device="cpu")
    batch = prompts(args.prompts)
    run_arm(backend, batch[:4], 1, 8)  # warm-up
    run_arm(backend, batch[:4], 4, 8)
    one: list[float] = []
    batched: list[float] = []
    for _ in range(args.repeats):
        one.append(run_arm(backend, batch, 1, args.max_new_tokens))
        batched.append(run_arm(backend, batch, args.prompts, args.max_new_tokens))
        print(f"repeat: one_at_a_time {one[-1]:.1f} tokens/s, batched {batched[-1]:.1f} tokens/s", flush=True)
    print(f"command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"model {args.model}, {args.prompts} prompts, max_new_tokens {args.max_new_tokens}, threads {args.threads}")
    for name, values in (("one_at_a_time", one), (f"batched_{args.prompts}", batched)):
        med = statistics.median(values)
        print(f"{name:<15} tokens/s median {med:7.1f} (min {min(values):.1f}, max {max(values):.1f})")
    print(f"ratio batched / one-at-a-time: {statistics.median(batched) / statistics.median(one):.2f}x")


if __name__ == "__main__":
    main()
