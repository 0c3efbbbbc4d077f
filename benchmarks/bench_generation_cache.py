"""HF generation on the quickstart eval: dynamic KV cache (the code before the option) vs static
cache vs static cache with a compiled decoding step.

The eval path of ``rayft eval`` in-process with configs/quickstart.yaml's eval section (the
built-in arithmetic test split through SmolLM2-135M-Instruct's chat template, greedy, the gsm8k
task's stop sequences, batch size 16, longest prompts first), shortened: ``--prompts`` rows and
``--max-new-tokens``. One backend is loaded; each arm sets its cache plan
(:class:`rayft.generation.kv_cache.CachePlan`). Every arm runs once as a warm-up (the compiled
arm compiles there: its time is printed), then the arms alternate A B C A B C; medians with min-max
of rows/s, and ratios against the dynamic cache measured in the same run. ``--device cuda`` runs
the same on a GPU (no Ray needed).

    .venv/bin/python benchmarks/bench_generation_cache.py [--prompts 32] [--max-new-tokens 64]
        [--repeats 2] [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generation_order import quickstart_eval
from rayft.generation.backend import Generation, Prompt, SamplingParams
from rayft.generation.hf import HFBackend
from rayft.generation.kv_cache import CachePlan

ARMS = {
    "dynamic": CachePlan(static=False, compile=False),
    "static": CachePlan(static=True, compile=False),
    "static+compile": CachePlan(static=True, compile=True),
}


def run_arm(
    backend: HFBackend, plan: CachePlan, prompts: list[Prompt], params: SamplingParams
) -> tuple[float, list[Generation]]:
    """Seconds to generate for every prompt with ``plan``, and the generations."""
    backend.cache = plan
    started = time.perf_counter()
    generations = backend.generate(prompts, params)
    seconds = time.perf_counter() - started
    assert all(g.error is None for g in generations)
    return seconds, generations


def main() -> None:
    """Measure the three arms and print rows/s, ratios and the command that produced them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from rayft.generation.factory import sampling_params

    torch.set_num_threads(args.threads)
    prompts, gen_cfg = quickstart_eval(args.prompts, args.max_new_tokens)
    backend = HFBackend(gen_cfg.model, device=args.device, batch_size=gen_cfg.batch_size)
    params = sampling_params(gen_cfg)

    warmup = {arm: run_arm(backend, plan, prompts, params)[0] for arm, plan in ARMS.items()}
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    outputs: dict[str, list[Generation]] = {}
    for _ in range(args.repeats):
        for arm, plan in ARMS.items():
            seconds, outputs[arm] = run_arm(backend, plan, prompts, params)
            rates[arm].append(len(prompts) / seconds)
            print(f"{arm:>15}: {rates[arm][-1]:.2f} rows/s", flush=True)
    report(args, gen_cfg.batch_size, warmup, rates, outputs)


def report(
    args: argparse.Namespace,
    batch_size: int,
    warmup: dict[str, float],
    rates: dict[str, list[float]],
    outputs: dict[str, list[Generation]],
) -> None:
    """Print the figures, the ratios against the dynamic cache, and whether the completions agree."""
    import torch

    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {args.device}, {load}")
    tokens = sum(g.num_generated_tokens for g in outputs["dynamic"])
    print(f"quickstart eval: {args.prompts} prompts, batch {batch_size}, max_new_tokens {args.max_new_tokens}, "
          f"greedy, {tokens} generated tokens per pass")  # fmt: skip
    base = statistics.median(rates["dynamic"])
    for arm, values in rates.items():
        median = statistics.median(values)
        print(f"{arm:>15}: {median:6.2f} rows/s (min {min(values):.2f}, max {max(values):.2f}), "
              f"{median / base:.2f}x of dynamic; warm-up pass {warmup[arm]:.1f} s")  # fmt: skip
    reference = [(g.text, g.num_generated_tokens) for g in outputs["dynamic"]]
    for arm in ("static", "static+compile"):
        same = [(g.text, g.num_generated_tokens) for g in outputs[arm]] == reference
        print(f"same completions as dynamic ({arm}): {same}")


if __name__ == "__main__":
    main()
