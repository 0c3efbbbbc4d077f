"""``train.compile`` on CPU: tokens/s of rayft's training step with every block compiled vs eager.

The step of :mod:`bench_gpu_step` (packed GSM8K-length examples, chunked loss, full fine-tuning,
the single-worker strategy) on a random-initialised small Qwen2-shaped model, 1 thread. The first
``--warmup`` steps (which compile) are left out of tokens/s and reported as the compile cost; arms
alternate A B A B in fresh processes, and their per-step losses must agree.

    .venv/bin/python benchmarks/bench_compile.py [--arch qwen2-tiny] [--seq 512] [--rows 2] [--steps 8]
        [--warmup 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ARM = """
import json, sys, time
import torch
sys.path.insert(0, "benchmarks")
from bench_gpu_step import build, gsm8k_like_examples, packed_batches
from rayft.training.strategies.table import parallelism
from rayft.training.modeling.precision import resolve_precision
from rayft.training.loop.steps import step_options, train_step
arch, seq, rows, steps, warmup, compiled = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6] == "1"
examples = [e for e in gsm8k_like_examples(4 * (steps + warmup) * rows * seq // 150, 0, 4096) if e["num_tokens"] <= seq]
batches = packed_batches(examples, seq, rows, steps + warmup)
device = torch.device("cpu")
model, optimizer, _ = build(arch, "full", "sdpa", device, compiled)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
options = step_options("sdpa", "auto", "cpu")
times, tokens, losses = [], [], []
for batch in batches:
    start = time.perf_counter()
    stats = train_step(model, optimizer, scheduler, [batch], parallel=parallelism("ddp", 1),
                       precision=resolve_precision("auto", "cpu"), scaler=None, max_grad_norm=1.0, world_size=1,
                       device=device, **options)
    times.append(time.perf_counter() - start)
    tokens.append(stats.real_tokens)
    losses.append(stats.loss)
print(json.dumps({"tokens_per_s": sum(tokens[warmup:]) / sum(times[warmup:]), "warmup_s": sum(times[:warmup]),
                  "losses": losses}))
"""


def run_arm(args: argparse.Namespace, compiled: bool) -> dict[str, Any]:
    """One arm in a fresh single-threaded process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", ARM, args.arch, str(args.seq), str(args.rows), str(args.steps),
               str(args.warmup), "1" if compiled else "0"]  # fmt: skip
    done = subprocess.run(command, env=env, check=False, capture_output=True, text=True, cwd=Path(__file__).parents[1])
    if done.returncode != 0:
        raise SystemExit(f"the {'compiled' if compiled else 'eager'} arm failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Alternate the arms and print the ratio with the command that produced it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2-tiny")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    eager, compiled = [], []
    for _ in range(args.rounds):
        eager.append(run_arm(args, compiled=False))
        compiled.append(run_arm(args, compiled=True))
    ratios = [c["tokens_per_s"] / e["tokens_per_s"] for c, e in zip(compiled, eager, strict=True)]
    agree = all(
        max(abs(a - b) / abs(b) for a, b in zip(c["losses"], e["losses"], strict=True)) < 1e-3
        for c, e in zip(compiled, eager, strict=True)
    )
    print(f"tokens/s eager: {[round(e['tokens_per_s']) for e in eager]}, "
          f"compiled: {[round(c['tokens_per_s']) for c in compiled]}")  # fmt: skip
    print(f"compiled / eager tokens/s: {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    warm = statistics.median(e["warmup_s"] for e in eager), statistics.median(c["warmup_s"] for c in compiled)
    print(f"first {args.warmup} steps (compilation) s: eager {warm[0]:.1f}, compiled {warm[1]:.1f}")
    print(f"per-step losses agree (rel 1e-3): {agree}")


if __name__ == "__main__":
    main()
