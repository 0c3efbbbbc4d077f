"""QLoRA's weight memory against LoRA on a bf16 base: SmolLM2-135M-Instruct (the built-in offline model)
built for training the way a worker builds it (``build_training_model``), each arm in a fresh process.

Reports per arm the model's weight bytes (parameters and buffers, as stored: packed 4-bit or 8-bit
for the quantized layers, with bitsandbytes' per-block or per-row scales), the process's peak RSS
after building the model, and the seconds of one training step on a 256-token row (CPU, float32
compute), and the base's mean token loss on a fixed English paragraph (what the quantization costs its
predictions); then each arm's ratio against bf16 LoRA measured in the same run. The "+emb" arms set
``lora.quantize_embeddings`` (the tied embedding and head quantized too). Target: nf4 weight bytes
at most 0.35x of bf16's.

On a GPU (``--device cuda``) each arm is built on the GPU with bitsandbytes' CUDA kernels, the
model's GPU memory after building it is reported too, and the step (timed after one warm-up step)
runs in bf16. ``--arch`` builds a random-initialised copy of a named architecture
(``rayft.testing.architectures``) instead of loading ``--model``: the same shapes, for machines
without the offline weights (no text loss then: a random model has no tokenizer and no predictions
worth scoring).

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
name, dtype, quantize, tables, seq = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
device, score_text = sys.argv[6], sys.argv[7] == "1"
lora = LoraConfig(quantize=quantize, quantize_embeddings=tables)
model = build_training_model(ModelConfig(name=name, dtype=dtype), lora, "lora", device, gradient_checkpointing=False,
                             restore_dir=None)
if quantize == "none":  # a quantized base is placed on its device as it loads
    model.to(device)
def size(t):
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
def state_bytes(p):  # bitsandbytes keeps a quantized weight's scales beside it, not as parameters or buffers
    total, state = size(getattr(p, "SCB", None)), getattr(p, "quant_state", None)
    while state is not None:
        total += size(state.absmax) + size(state.code) + size(state.offset)
        state = state.state2
    return total
weights = sum(size(t) + state_bytes(t) for t in [*model.parameters(), *model.buffers()])
peak_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
gpu = torch.cuda.memory_allocated() if device == "cuda" else 0
ids = torch.randint(0, 1000, (1, seq), device=device)
def step():
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        model(input_ids=ids, labels=ids).loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
if device == "cuda":
    step()  # warm-up: kernels load, caches fill
start = time.perf_counter()
step()
step_s = time.perf_counter() - start
text_loss = None
if score_text:
    from rayft.models.loading import load_tokenizer
    text = load_tokenizer(ModelConfig(name=name))(TEXT, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():  # the adapter starts at zero: this is the quantized base's own loss on the text
        text_loss = model.eval()(input_ids=text, labels=text).loss.item()
print(json.dumps({"weight_bytes": weights, "peak_rss_build": peak_build, "gpu_bytes": gpu, "step_s": step_s,
                  "text_loss": text_loss}))
"""

# Plain English the model has not been tuned on, to see what each quantization costs the base's predictions.
TEXT = (
    "The river rises in the hills to the north and runs south through farmland for about forty miles before "
    "it reaches the sea. In spring, when the snow melts, it often floods the lower fields, so the farmers there "
    "plant late and harvest early. A small town grew up where the old road crosses the river, first around a "
    "mill and later around the railway station, which brought visitors from the city every summer. Today most "
    "people who live there work in the city and travel by train each morning, but the market still opens on "
    "Saturdays, and the mill has become a museum that explains how flour was made two hundred years ago."
)

# (label, base dtype, lora.quantize, lora.quantize_embeddings)
ARMS = (
    ("bf16 LoRA", "bfloat16", "none", False),
    ("int8 QLoRA", "bfloat16", "int8", False),
    ("int8 +emb", "bfloat16", "int8", True),
    ("nf4 QLoRA", "bfloat16", "nf4", False),
    ("nf4 +emb", "bfloat16", "nf4", True),
)


def run_arm(model: str, arm: tuple[str, str, bool], seq: int, device: str, score_text: bool) -> dict[str, Any]:
    """One arm in a fresh process (its peak RSS is its own)."""
    dtype, quantize, tables = arm
    argv = [sys.executable, "-c", f"TEXT = {TEXT!r}\n{ARM}", model, dtype, quantize, "1" if tables else "0", str(seq),
            device, "1" if score_text else "0"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"arm {arm} failed:\n{out.stderr[-3000:]}")
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
        results = {label: run_arm(model, (dtype, quantize, tables), args.seq, args.device, not args.arch)
                   for label, dtype, quantize, tables in ARMS}  # fmt: skip
    base = results["bf16 LoRA"]
    print(f"{'arm':<12} {'weights MiB':>12} {'x bf16':>7} {'peak RSS MiB':>13} {'x bf16':>7} {'GPU MiB':>8} "
          f"{'x bf16':>7} {'step s':>7} {'text loss':>10}")  # fmt: skip
    for label, r in results.items():
        gpu = f"{r['gpu_bytes'] / 2**20:>8.1f} {r['gpu_bytes'] / max(base['gpu_bytes'], 1):>7.2f}"
        text = "-" if r["text_loss"] is None else f"{r['text_loss']:.4f}"
        print(f"{label:<12} {r['weight_bytes'] / 2**20:>12.1f} {r['weight_bytes'] / base['weight_bytes']:>7.2f} "
              f"{r['peak_rss_build'] / 2**20:>13.0f} {r['peak_rss_build'] / base['peak_rss_build']:>7.2f} "
              f"{gpu} {r['step_s']:>7.3f} {text:>10}")  # fmt: skip


if __name__ == "__main__":
    main()
