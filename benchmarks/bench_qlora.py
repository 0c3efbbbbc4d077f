"""QLoRA's weight memory against LoRA on a bf16 base: SmolLM2-135M-Instruct (the built-in offline model)
built for training the way a worker builds it (``build_training_model``), each arm in a fresh process.

Reports per arm the model's weight bytes (parameters and buffers, as stored: packed 4-bit or 8-bit
for the quantized linear layers), the process's peak RSS after building the model, and the seconds
of one training step on a 256-token row (CPU, float32 compute); then each arm's ratio against bf16
LoRA measured in the same run. Target: nf4 weight bytes at most 0.35x of bf16's.

    .venv/bin/python benchmarks/bench_qlora.py [--model smollm2-135m-instruct] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

ARM = """
import json, resource, sys, time
import torch
from rayft.config import LoraConfig, ModelConfig
from rayft.training.modeling.model import build_training_model
name, dtype, quantize, seq = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = build_training_model(ModelConfig(name=name, dtype=dtype), LoraConfig(quantize=quantize), "lora", "cpu",
                             gradient_checkpointing=False, restore_dir=None)
weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
peak_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ids = torch.randint(0, 1000, (1, seq))
start = time.perf_counter()
model(input_ids=ids, labels=ids).loss.backward()
step = time.perf_counter() - start
print(json.dumps({"weight_bytes": weights, "peak_rss_build": peak_build, "step_s": step}))
"""

ARMS = (("bf16 LoRA", "bfloat16", "none"), ("int8 QLoRA", "bfloat16", "int8"), ("nf4 QLoRA", "bfloat16", "nf4"))


def run_arm(model: str, dtype: str, quantize: str, seq: int) -> dict[str, Any]:
    """One arm in a fresh process (its peak RSS is its own)."""
    out = subprocess.run([sys.executable, "-c", ARM, model, dtype, quantize, str(seq)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Measure every arm and print the table with ratios against bf16 LoRA."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    results = {label: run_arm(args.model, dtype, quantize, args.seq) for label, dtype, quantize in ARMS}
    base = results["bf16 LoRA"]
    print(f"{'arm':<12} {'weights MiB':>12} {'x bf16':>7} {'peak RSS MiB':>13} {'x bf16':>7} {'step s':>7}")
    for label, r in results.items():
        print(f"{label:<12} {r['weight_bytes'] / 2**20:>12.1f} {r['weight_bytes'] / base['weight_bytes']:>7.2f} "
              f"{r['peak_rss_build'] / 2**20:>13.0f} {r['peak_rss_build'] / base['peak_rss_build']:>7.2f} "
              f"{r['step_s']:>7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
