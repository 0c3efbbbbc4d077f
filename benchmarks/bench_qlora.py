"""QLoRA's weight memory against LoRA on a bf16 base: SmolLM2-135M-Instruct (the built-in offline model)
built for training the way a worker builds it (``build_training_model``), each arm in a fresh process.

Reports per arm the model's weight bytes (parameters and buffers, as stored: packed 4-bit or 8-bit
for the quantized layers, with bitsandbytes' per-block or per-row scales), the process's peak RSS
after building the model, and the seconds of one training step on a 256-token row (CPU, float32
compute), and the base's mean token loss on a fixed English paragraph (what the quantization costs its
predictions); then each arm's ratio against bf16 LoRA measured in the same run. The "+emb" arms set
``lora.quantize_embeddings`` (the tied embedding and head quantized too). Target: nf4 weight bytes
at most 0.35x of bf16's.

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
name, dtype, quantize, tables, seq = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
lora = LoraConfig(quantize=quantize, quantize_embeddings=tables)
model = build_training_model(ModelConfig(name=name, dtype=dtype), lora, "lora", "cpu", gradient_checkpointing=False,
                             restore_dir=None)
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
ids = torch.randint(0, 1000, (1, seq))
start = time.perf_counter()
model(input_ids=ids, labels=ids).loss.backward()
step = time.perf_counter() - start
from rayft.models.loading import load_tokenizer
text = load_tokenizer(ModelConfig(name=name))(TEXT, return_tensors="pt").input_ids
with torch.no_grad():  # the adapter starts at zero: this is the quantized base's own loss on the text
    text_loss = model.eval()(input_ids=text, labels=text).loss.item()
print(json.dumps({"weight_bytes": weights, "peak_rss_build": peak_build, "step_s": step, "text_loss": text_loss}))
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


def run_arm(model: str, dtype: str, quantize: str, tables: bool, seq: int) -> dict[str, Any]:
    """One arm in a fresh process (its peak RSS is its own)."""
    argv = [sys.executable, "-c", f"TEXT = {TEXT!r}\n{ARM}", model, dtype, quantize, "1" if tables else "0", str(seq)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Measure every arm and print the table with ratios against bf16 LoRA."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    results = {label: run_arm(args.model, *arm, args.seq) for label, *arm in ARMS}
    base = results["bf16 LoRA"]
    print(f"{'arm':<12} {'weights MiB':>12} {'x bf16':>7} {'peak RSS MiB':>13} {'x bf16':>7} {'step s':>7} "
          f"{'text loss':>10}")  # fmt: skip
    for label, r in results.items():
        print(f"{label:<12} {r['weight_bytes'] / 2**20:>12.1f} {r['weight_bytes'] / base['weight_bytes']:>7.2f} "
              f"{r['peak_rss_build'] / 2**20:>13.0f} {r['peak_rss_build'] / base['peak_rss_build']:>7.2f} "
              f"{r['step_s']:>7.2f} {r['text_loss']:>10.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
