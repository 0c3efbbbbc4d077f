"""QLoRA's weight memory against LoRA on a bf16 base: SmolLM2-135M-Instruct (the built-in offline model)
built for training the way a worker builds it (``build_training_model``), each arm in a fresh process.

Reports per arm the model's weight bytes (parameters and buffers, as stored: packed 4-bit or 8-bit
for the quantized linear layers), the process's peak RSS after building the model, and the seconds
of one training step on a 256-token row (CPU, float32 compute); then each arm's ratio against bf16
LoRA measured in the same run. Target: nf4 weight bytes at most 0.35x of bf16's.

On a GPU (``--device cuda``) each arm is built on the GPU with bitsandbytes' CUDA kernels, the
model's GPU memory after building it is reported too, and the step runs in bf16. ``--arch`` builds
a random-initialised copy of a named architecture (``rayft.testing.architectures``) instead of
loading ``--model``: the same shapes, for machines without the offline weights.

    .venv/bin/python benchmarks/bench_qlora.py [--model smollm2-135m-instruct] [--seq 256]
    python benchmarks/bench_qlora.py --device cuda --arch smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ARM = """
import json, resource, sys, time
import torch
from rayft.config import LoraConfig, ModelConfig
from rayft.training.modeling.model import build_training_model
name, dtype, quantize, seq, device = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
model = build_training_model(ModelConfig(name=name, dtype=dtype), LoraConfig(quantize=quantize), "lora", device,
                             gradient_checkpointing=False, restore_dir=None)
if quantize == "none":  # a quantized base is placed on its device as it loads
    model.to(device)
weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
peak_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
gpu = torch.cuda.memory_allocated() if device == "cuda" else 0
ids = torch.randint(0, 1000, (1, seq), device=device)
autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
with autocast:
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up: kernels load, caches fill
if device == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
with autocast:
    model(input_ids=ids, labels=ids).loss.backward()
if device == "cuda":
    torch.cuda.synchronize()
step = time.perf_counter() - start
print(json.dumps({"weight_bytes": weights, "peak_rss_build": peak_build, "gpu_bytes": gpu, "step_s": step}))
"""

ARMS = (("bf16 LoRA", "bfloat16", "none"), ("int8 QLoRA", "bfloat16", "int8"), ("nf4 QLoRA", "bfloat16", "nf4"))


def run_arm(model: str, dtype: str, quantize: str, seq: int, device: str) -> dict[str, Any]:
    """One arm in a fresh process (its peak RSS is its own)."""
    out = subprocess.run([sys.executable, "-c", ARM, model, dtype, quantize, str(seq), device], capture_output=True,
                         text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"arm {quantize} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def random_copy(arch: str, directory: Path) -> str:
    """A random-initialised ``arch`` saved in bf16 under ``directory`` (the shapes of the real model)."""
    import torch

    from rayft.testing.architectures import random_model

    random_model(arch, dtype=torch.bfloat16, device="cpu").save_pretrained(directory)
    return str(directory)


def main() -> None:
    """Measure every arm and print the table with ratios against bf16 LoRA."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--arch", help="build a random-initialised copy of this architecture instead of --model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-qlora-") as tmp:
        model = random_copy(args.arch, Path(tmp)) if args.arch else args.model
        results = {label: run_arm(model, dtype, quantize, args.seq, args.device) for label, dtype, quantize in ARMS}
    base = results["bf16 LoRA"]
    print(f"{'arm':<12} {'weights MiB':>12} {'x bf16':>7} {'peak RSS MiB':>13} {'x bf16':>7} {'GPU MiB':>8} "
          f"{'x bf16':>7} {'step s':>7}")  # fmt: skip
    for label, r in results.items():
        gpu = f"{r['gpu_bytes'] / 2**20:>8.1f} {r['gpu_bytes'] / max(base['gpu_bytes'], 1):>7.2f}"
        print(f"{label:<12} {r['weight_bytes'] / 2**20:>12.1f} {r['weight_bytes'] / base['weight_bytes']:>7.2f} "
              f"{r['peak_rss_build'] / 2**20:>13.0f} {r['peak_rss_build'] / base['peak_rss_build']:>7.2f} "
              f"{gpu} {r['step_s']:>7.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
