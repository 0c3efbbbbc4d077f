"""A frozen linear layer's forward and backward (the input's gradient) in float32 against bf16, by width (CPU).

What ``train.frozen_precision: bf16`` changes in a LoRA step, alone: one frozen layer of a Llama block's
shape (``hidden`` in, ``3 x hidden`` out, as the MLP's up projection; and back, as its down projection) on
``--positions`` positions, float32 (``nn.Linear``) against :class:`rayft.training.modeling.frozen_bf16.
FrozenBf16Linear` (the input cast to bf16 and the output back included), the two alternating round by
round. Prints the time of both directions per arm and the ratio, for each width; the planner's threshold
(``FROZEN_BF16_MIN_HIDDEN``) is read from it. On a CPU without bf16 instructions torch emulates the bf16
product, and the ratio says so.

    flock /tmp/rayft-bench.lock .venv/bin/python benchmarks/bench_frozen_bf16.py [--threads 2]
        [--positions 256,1024] [--widths 32,64,128,256,384,576,960,1536,2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def both_directions(layer: Any, x: Any, grad: Any, repeats: int) -> float:
    """Mean seconds of ``layer``'s forward and backward over ``repeats`` (after one warm-up)."""
    for index in range(repeats + 1):
        if index == 1:
            start = time.perf_counter()
        x.grad = None
        layer(x).backward(grad)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    """Each width and number of positions: float32 and bf16 alternating, their best rounds, the ratio."""
    import torch

    from rayft.training.modeling.frozen_bf16 import FrozenBf16Linear
    from rayft.training.modeling.step_choice import FROZEN_BF16_MIN_HIDDEN
    from rayft.training.modeling.step_facts import cpu_bf16_flags

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--positions", default="256,1024")
    parser.add_argument("--widths", default="32,64,128,256,384,576,960,1536,2048")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10, help="forward-backward pairs per round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    flags = ", ".join(sorted(cpu_bf16_flags())) or "none"
    print(f"torch {torch.__version__}, {args.threads} threads, bf16 instructions: {flags}, "
          f"load {Path('/proc/loadavg').read_text().split()[:3]}; planner's threshold: hidden >= "
          f"{FROZEN_BF16_MIN_HIDDEN}")  # fmt: skip
    print(f"{'positions':>9} {'hidden':>6} {'fp32 ms':>9} {'bf16 ms':>9} {'fp32/bf16':>10}")
    for positions in (int(p) for p in args.positions.split(",")):
        for hidden in (int(w) for w in args.widths.split(",")):
            times = {"fp32": 0.0, "bf16": 0.0}
            for shape in ((hidden, 3 * hidden), (3 * hidden, hidden)):
                plain = torch.nn.Linear(*shape, bias=False).requires_grad_(False)
                arms = {"fp32": plain, "bf16": FrozenBf16Linear(plain)}
                x = torch.randn(positions, shape[0], requires_grad=True)
                grad = torch.randn(positions, shape[1])
                best = {name: float("inf") for name in arms}
                for _ in range(args.rounds):
                    for name, layer in arms.items():
                        best[name] = min(best[name], both_directions(layer, x, grad, args.repeats))
                for name in arms:
                    times[name] += best[name]
            print(f"{positions:>9} {hidden:>6} {times['fp32'] * 1e3:>9.3f} {times['bf16'] * 1e3:>9.3f} "
                  f"{times['fp32'] / times['bf16']:>9.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
