"""Sequence packing on GSM8K train with the SmolLM2 tokenizer at max_seq_length 1024: padding
efficiency (real tokens / computed tokens) and real training tokens/s, packed vs padded.

Data are prepared by rayft (`prepare`, in-process) with packing off and on. Efficiency is computed
over a whole epoch exactly as the training loop batches it (`rayft.data.collate`: each micro-batch
is padded to its longest row). Throughput runs rayft's own loss (`token_loss_sum`) with a backward
pass and an AdamW step on a small random-init Llama that uses SmolLM2's vocabulary (the 135M model
itself does ~100 tokens/s on these CPUs, too slow to measure several steps of each arm), fp32,
with the attention rayft trains with on CPU (`training_attention`: SDPA per example; `--attention sdpa`
for transformers' block-diagonal mask instead). The two arms alternate step by step (A B A B) after one
warm-up step each; medians of the repeats with min-max, and the ratio over all steps.

    .venv/bin/python benchmarks/bench_packing.py [--steps 4] [--repeats 3] [--padded-batch 8] [--packed-batch 2]
        [--attention rayft|sdpa]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
MODEL = "smollm2-135m-instruct"
MAX_LEN = 1024


def prepare_units(packing: bool) -> tuple[Any, list[dict[str, Any]]]:
    """The prepared dataset and its training units, in file order."""
    import pyarrow.parquet as pq

    from rayft.config import load_config
    from rayft.data.prepare import prepare

    cfg = load_config(None, [f"model.name={MODEL}", f"data.datasets=[{{path: '{GSM8K}'}}]",
                             f"data.max_seq_length={MAX_LEN}", f"data.packing={str(packing).lower()}"])  # fmt: skip
    prepared = prepare(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False).prepared
    return prepared, [row for f in prepared.train.files for row in pq.read_table(f).to_pylist()]


def epoch_batches(units: list[dict[str, Any]], batch: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Micro-batches of one shuffled epoch."""
    order = list(range(len(units)))
    random.Random(seed).shuffle(order)
    return [[units[i] for i in order[start : start + batch]] for start in range(0, len(order), batch)]


def efficiency(batches: list[list[dict[str, Any]]]) -> float:
    """Real tokens / computed tokens when each micro-batch is padded to its longest row."""
    real = sum(u["num_tokens"] for b in batches for u in b)
    computed = sum(len(b) * max(u["num_tokens"] for u in b) for b in batches)
    return real / computed


def build_model(vocab: int, hidden: int, layers: int) -> Any:
    """A random-init Llama with SmolLM2's vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         num_key_value_heads=max(1, hidden // 128), max_position_embeddings=MAX_LEN,
                         tie_word_embeddings=True, attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(config)


def train_step(model: Any, optimizer: Any, units: list[dict[str, Any]], pad_id: int) -> tuple[int, float]:
    """(real tokens, seconds) of one optimizer step on one micro-batch."""
    from rayft.data.collate import collate
    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    started = time.perf_counter()
    micro = collate(units, pad_id)
    loss = token_loss_sum(model, micro, Precision(None, False)) / max(micro.num_label_tokens, 1)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return micro.num_tokens, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="measured optimizer steps per arm and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (steps x repeats alternating pairs in all)")
    parser.add_argument("--padded-batch", type=int, default=8, help="examples per micro-batch, unpacked")
    parser.add_argument("--packed-batch", type=int, default=2, help="packed rows per micro-batch")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--attention",
        choices=["rayft", "sdpa"],
        default="rayft",
        help="rayft: the attention rayft trains with on CPU; sdpa: transformers' block-diagonal mask",
    )
    args = parser.parse_args()

    import torch

    os.environ.setdefault("RAYFT_DATA_CACHE", str(Path(tempfile.gettempdir()) / "rayft-bench-data"))
    padded_data, padded_units = prepare_units(packing=False)
    packed_data, packed_units = prepare_units(packing=True)
    padded_batches = epoch_batches(padded_units, args.padded_batch)
    packed_batches = epoch_batches(packed_units, args.packed_batch)
    fill = packed_data.train.num_tokens / (packed_data.train.num_units * MAX_LEN)
    to_max = padded_data.train.num_tokens / (padded_data.train.num_units * MAX_LEN)

    from rayft.models.loading import load_tokenizer

    tokenizer = load_tokenizer(load_config_model())
    model = build_model(len(tokenizer), args.hidden, args.layers)
    if args.attention == "rayft":
        from rayft.training.modeling.attention import use_training_attention

        use_training_attention(model, "sdpa", "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    arms = {"padded": padded_batches, "packed": packed_batches}
    measured: dict[str, list[tuple[int, float]]] = {name: [] for name in arms}
    # Steps alternate one by one (A B A B ...) so that both arms see the same machine load; the
    # first step of each arm is a warm-up. Each step takes the next micro-batch of its arm's epoch,
    # so a repeat's tokens/s is its steps' real tokens over their time (micro-batches differ in size).
    for step in range(args.steps * args.repeats + 1):
        for name, batches in arms.items():
            tokens, seconds = train_step(model, optimizer, batches[step], tokenizer.pad_token_id)
            if step > 0:
                measured[name].append((tokens, seconds))
            print(f"  step {step} {name}: {tokens / seconds:.0f} real tokens/s", flush=True)
    rates = {name: [_rate(steps[r * args.steps : (r + 1) * args.steps]) for r in range(args.repeats)]
             for name, steps in measured.items()}  # fmt: skip

    n_examples = padded_data.train.num_examples
    print(f"\nGSM8K train: {n_examples} examples, {padded_data.train.num_tokens} tokens, SmolLM2 tokenizer, "
          f"max_seq_length {MAX_LEN}")  # fmt: skip
    print(f"  packed: {packed_data.train.num_units} rows; fill (real / rows x {MAX_LEN}) {fill:.4f}  [target >= 0.97]")
    print("  padding efficiency per epoch (micro-batches padded to their longest row, as rayft collates):")
    print(f"    padded, {args.padded_batch} examples per micro-batch: {efficiency(padded_batches):.4f}")
    print(f"    packed, {args.packed_batch} rows per micro-batch:     {efficiency(packed_batches):.4f}")
    print(f"    padded to max_seq_length (fixed shapes):       {to_max:.4f}")
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"  {name}: {med[name]:.0f} real tokens/s, median of {args.repeats} repeats of {args.steps} steps "
              f"(min {min(r):.0f}, max {max(r):.0f}); all steps: {_rate(measured[name]):.0f}")  # fmt: skip
    ratios = [p / q for p, q in zip(rates["packed"], rates["padded"], strict=True)]  # per repeat, interleaved
    overall = _rate(measured["packed"]) / _rate(measured["padded"])
    print(f"  packed / padded: {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}); "
          f"all steps {overall:.2f}x  [target >= 1.5x]")  # fmt: skip
    print(f"  model: random-init Llama, hidden {args.hidden}, {args.layers} layers, vocab {len(tokenizer)}, fp32, "
          f"{torch.get_num_threads()} torch threads, attention {model.config._attn_implementation}; "
          f"load {os.getloadavg()}")  # fmt: skip
    print(f"  command: .venv/bin/python benchmarks/bench_packing.py --steps {args.steps} --repeats {args.repeats} "
          f"--padded-batch {args.padded_batch} --packed-batch {args.packed_batch} --hidden {args.hidden} "
          f"--layers {args.layers} --attention {args.attention}")  # fmt: skip


def _rate(steps: list[tuple[int, float]]) -> float:
    """Real tokens per second over (tokens, seconds) steps."""
    return sum(t for t, _ in steps) / sum(s for _, s in steps)


def load_config_model() -> Any:
    """The SmolLM2 model config (for its tokenizer)."""
    from rayft.config import ModelConfig

    return ModelConfig(name=MODEL)


if __name__ == "__main__":
    main()
