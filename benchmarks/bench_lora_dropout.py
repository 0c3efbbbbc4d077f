"""LoRA's input dropout on CPU: PEFT's path against rayft's lean layer, with torch's mask and with the CPU's.

One adapter's ``lora_A`` with its input dropout, forward and backward (the input's gradient and the weight's),
at SmolLM2-135M-Instruct's widths: 576 (the attention projections, gate and up: six adapted layers per block)
and 1,536 (down: one per block), ``r`` 16, ``--tokens`` positions, dropout ``--p``, in one process, the arms
alternating round by round so that each sees the same machine:

- ``peft``: PEFT's own computation, ``lora_A(nn.Dropout(p)(x))`` (torch's dropout kernel; autograd keeps the
  dropped-out input and the mask);
- ``lean-torch-mask``: :class:`rayft.training.modeling.lora_dropout.DroppedInputLinear` with torch's dropout
  kernel drawing the mask (what it does on CUDA, and did on CPU before the CPU's own mask);
- ``lean``: the same layer as it runs on CPU (:func:`~rayft.training.modeling.lora_dropout.cpu_keep_mask`,
  the scale on the weight).

Printed: milliseconds per call (median over rounds) and the ratio to ``peft``, per width, and the sum over
one step's 30 blocks (six calls at 576 and one at 1,536 per block).

    flock /tmp/rayft-bench.lock .venv/bin/python benchmarks/bench_lora_dropout.py [--tokens 1024] [--p 0.05]
        [--rounds 15] [--calls 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from rayft.training.modeling import lora_dropout

WIDTHS = {576: 6, 1536: 1}  # width: adapted layers of that input width per block
BLOCKS, RANK = 30, 16
ARMS = ("peft", "lean-torch-mask", "lean")


def arm_call(arm: str, x: torch.Tensor, weight: torch.Tensor, p: float) -> Callable[[], None]:
    """One forward and backward of ``arm`` on ``x``."""
    grad_out = torch.randn(*x.shape[:-1], weight.shape[0])
    dropout = torch.nn.Dropout(p)

    def peft() -> None:
        out = torch.nn.functional.linear(dropout(x), weight)
        out.backward(grad_out)

    def lean() -> None:
        out = lora_dropout._DroppedInputLinear.apply(x, weight, p)  # type: ignore[no-untyped-call]
        out.backward(grad_out)

    return peft if arm == "peft" else lean


def timed(arm: str, call: Callable[[], None], calls: int) -> float:
    """Milliseconds per call of ``call``, ``arm`` choosing the mask's source."""
    original = lora_dropout.cpu_keep_mask
    if arm == "lean-torch-mask":
        lora_dropout.cpu_keep_mask = lambda shape, p: None  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls * 1e3
    finally:
        lora_dropout.cpu_keep_mask = original


def main() -> None:
    """Each width's arms, round by round; medians and ratios to PEFT's path."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="positions per call (micro-batch x length)")
    parser.add_argument("--p", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per arm per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"command: bench_lora_dropout.py --tokens {args.tokens} --p {args.p} --rounds {args.rounds} "
          f"--calls {args.calls} --threads {args.threads}; torch {torch.__version__}")  # fmt: skip
    step = dict.fromkeys(ARMS, 0.0)
    print("| width | arm | ms per call | vs peft |\n|---|---|---|---|")
    for width, per_block in WIDTHS.items():
        x = torch.randn(args.tokens, width, requires_grad=True)
        weight = torch.randn(RANK, width, requires_grad=True)
        calls = {arm: arm_call(arm, x, weight, args.p) for arm in ARMS}
        for arm in ARMS:  # warm-up
            timed(arm, calls[arm], 2)
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                times[arm].append(timed(arm, calls[arm], args.calls))
        medians = {arm: statistics.median(v) for arm, v in times.items()}
        for arm in ARMS:
            print(f"| {width} | {arm} | {medians[arm]:.3f} | {medians['peft'] / medians[arm]:.2f}x |")
            step[arm] += medians[arm] * per_block * BLOCKS
    print("\n| one step's adapted layers (30 blocks) | ms | vs peft |\n|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | {step[arm]:.0f} | {step['peft'] / step[arm]:.2f}x |")


if __name__ == "__main__":
    main()
