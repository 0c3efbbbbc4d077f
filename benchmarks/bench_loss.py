"""Chunked vs plain cross-entropy at the output head: peak memory and speed, on CPU.

The loss of one micro-batch of 1024 trained positions against SmolLM2's head (hidden 576, vocabulary
49,152), forward and backward, fp32: the plain loss (``train.fused_loss=none``: all logits, then
cross-entropy) against rayft's chunked loss (``train.fused_loss=chunked``,
:mod:`rayft.training.modeling.loss`). Two cases: the head frozen (LoRA) and trained (full fine-tuning, which
adds the head's weight gradient to both arms).

Each arm runs in a fresh process: peak memory is the rise of the process's peak resident set over
what it held once its inputs existed (PyTorch's CPU allocator returns large blocks to the system, so
the peak is the arm's own). Time is the median of ``--repeats`` forward+backward passes after one
warm-up; arms alternate A B A B. Targets: memory <= 0.5x, speed >= 0.95x of plain.

    .venv/bin/python benchmarks/bench_loss.py [--tokens 1024] [--repeats 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HIDDEN, VOCAB = 576, 49152  # SmolLM2-135M

ARM = f"""
import json, resource, sys, time
import torch
from torch.nn.functional import cross_entropy, linear
from rayft.training.modeling.loss import head_loss
arm, tokens, repeats, train_head = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
torch.manual_seed(0)
hidden = torch.randn(tokens, {HIDDEN}, requires_grad=True)
weight = (torch.randn({VOCAB}, {HIDDEN}) * 0.02).requires_grad_(train_head)
targets = torch.randint(0, {VOCAB}, (tokens,))
def once():
    if arm == "plain":
        loss = cross_entropy(linear(hidden, weight).float(), targets, reduction="sum")
    else:
        loss = head_loss(hidden, weight, None, targets, "chunked")
    loss.backward()
    hidden.grad = None
    weight.grad = None
    return float(loss.detach())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
value = once()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
times = []
for _ in range(repeats):
    start = time.perf_counter()
    once()
    times.append(time.perf_counter() - start)
print(json.dumps({{"peak_mib": peak / 1024, "seconds": sorted(times)[len(times) // 2], "loss": value}}))
"""


def run_arm(arm: str, tokens: int, repeats: int, train_head: bool) -> dict[str, float]:
    """One arm in a fresh single-threaded process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", ARM, arm, str(tokens), str(repeats), "1" if train_head else "0"]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Measure both cases and print the ratios with the command that produced them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"head {HIDDEN} x {VOCAB}, {args.tokens} trained positions, fp32, 1 thread")
    for train_head, case in ((False, "head frozen (LoRA)"), (True, "head trained (full)")):
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "chunked": []}
        for _ in range(args.rounds):
            for arm, measured in runs.items():
                measured.append(run_arm(arm, args.tokens, args.repeats, train_head))
        plain, chunked = runs["plain"], runs["chunked"]
        assert all(abs(c["loss"] - p["loss"]) <= 1e-3 * abs(p["loss"]) for c, p in zip(chunked, plain, strict=True))
        memory = statistics.median(p["peak_mib"] for p in plain), statistics.median(c["peak_mib"] for c in chunked)
        seconds = statistics.median(p["seconds"] for p in plain), statistics.median(c["seconds"] for c in chunked)
        print(f"[{case}] peak memory MiB: plain {memory[0]:.0f}, chunked {memory[1]:.0f} "
              f"-> ratio {memory[1] / memory[0]:.2f} (target <= 0.5)")  # fmt: skip
        print(f"[{case}] forward+backward s: plain {seconds[0]:.3f}, chunked {seconds[1]:.3f} "
              f"-> speed ratio {seconds[0] / seconds[1]:.2f} (target >= 0.95)")  # fmt: skip


if __name__ == "__main__":
    main()
