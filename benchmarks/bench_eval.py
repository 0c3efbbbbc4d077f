"""Evaluation generation: batched (16 prompts per generate call) vs one prompt at a time, on CPU.

    .venv/bin/python benchmarks/bench_eval.py [--model smollm2-135m-instruct] [--prompts 16]
        [--max-new-tokens 32] [--batch-size 16] [--repeats 3]

Both arms run the eval path of ``rayft eval`` in-process (gsm8k prompts of the built-in test split
through the model's chat template, greedy decoding, the task's stop sequences) on the same prompts
with the same model, alternating A B A B after one warm-up of each. Tokens are real generated
tokens (up to and including EOS; padding and tokens after a stop are not counted). Prints the
median tokens/s of each arm with min-max, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from rayft.config import load_config
from rayft.evaluation.runner import generation_config, load_examples
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import GenerationBackend, Prompt, SamplingParams
from rayft.models.sources import resolve_source


def run_arm(backend: GenerationBackend, prompts: list[Prompt], params: SamplingParams, batch: int) -> tuple[float, int]:
    """Generate for every prompt, ``batch`` at a time; return (seconds, real generated tokens)."""
    started = time.perf_counter()
    tokens = 0
    for start in range(0, len(prompts), batch):
        tokens += sum(g.num_generated_tokens for g in backend.generate(prompts[start : start + batch], params))
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from rayft.generation.factory import build_backend, sampling_params

    cfg = load_config(
        None,
        [
            f"model.name={args.model}",
            f"eval.max_samples={args.prompts}",
            f"eval.batch_size={args.batch_size}",
            f"eval.generation.max_new_tokens={args.max_new_tokens}",
        ],
    )
    task = build_task(cfg.eval)
    prompts = [e.prompt for e in load_examples(cfg.eval, task).items]
    gen_cfg = generation_config(cfg.eval, resolve_source(args.model, cfg.model), task)
    backend = build_backend(gen_cfg)
    params = sampling_params(gen_cfg)

    arms = {"one-at-a-time": 1, f"batched-{args.batch_size}": args.batch_size}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    counts: dict[str, int] = {}
    for batch in arms.values():  # warm-up, discarded
        run_arm(backend, prompts, params, batch)
    for _ in range(args.repeats):
        for name, batch in arms.items():
            seconds, tokens = run_arm(backend, prompts, params, batch)
            rates[name].append(tokens / seconds)
            counts[name] = tokens

    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, uptime: {load}")
    print(f"model {args.model}, {len(prompts)} prompts, max_new_tokens {args.max_new_tokens}, greedy")
    for name, values in rates.items():
        print(
            f"{name:>16}: median {statistics.median(values):8.1f} tokens/s "
            f"(min {min(values):.1f}, max {max(values):.1f}; {counts[name]} real tokens per pass)"
        )
    base, batched = (statistics.median(v) for v in rates.values())
    print(f"ratio batched / one-at-a-time: {batched / base:.2f}x (target >= 4x)")
    if counts["one-at-a-time"] != counts[f"batched-{args.batch_size}"]:
        print("note: the arms generated different token counts (batched greedy decoding can differ numerically)")


if __name__ == "__main__":
    main()
