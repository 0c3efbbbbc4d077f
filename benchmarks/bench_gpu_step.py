"""rayft's training step on a GPU: packed + variable-length attention + fused loss against padding +
eager attention + plain cross-entropy, in one run, without Ray.

Both arms run rayft's own step (:func:`rayft.training.loop.steps.train_step` with the single-worker
strategy, the model prepared by :func:`rayft.training.modeling.model.prepare_training_model`, AdamW over
rayft's parameter groups, bf16 autocast) on a random-initialised model of a named architecture
(:mod:`rayft.testing.architectures`: Qwen2.5-1.5B, Llama-3.2-1B; nothing is downloaded), LoRA
(bf16 frozen base) and full fine-tuning (fp32 master weights):

- ``rayft``: examples packed into rows of ``--seq`` tokens (first-fit decreasing), the examples'
  bounds passed to the attention kernel (``--attn auto``: flash_attention_2 when flash-attn is
  installed, else sdpa over the packed mask), ``train.fused_loss=auto`` (Liger when installed, else
  chunked), optionally ``--compile`` (each block);
- ``padded``: the same examples one per row, padded to the longest of the micro-batch (as many
  rows as give the same real tokens per step), eager attention, plain cross-entropy.

Examples have GSM8K-like lengths (seeded: prompt 40-300 tokens around 110, answer 30-400 around
120, loss on the answer), random token ids.

Throughput counts real tokens (never padding). MFU = achieved model FLOP/s / peak, with the model
FLOPs per real token

    full: 6 N + 12 L d s        LoRA: 4 N + 12 L d s

N: parameters of every linear layer, output head included (embedding lookups do no products); the
forward pass is 2N per token, the backward 4N (gradients of activations and of weights), of which
a frozen LoRA base skips the weight half (2N), the adapters' own FLOPs being negligible. Attention
scores and values add 12 L d s per token (forward 4 L d s, backward twice that), with L layers,
d = heads x head_dim and s the mean length of the example each token attends in (examples never
attend each other, so padding and other examples in the row are not useful work). Peak: H100 SXM
dense bf16, 989 TFLOP/s (``--peak-tflops`` for other GPUs). Peak memory is
``torch.cuda.max_memory_allocated`` over each arm.

    python benchmarks/bench_gpu_step.py [--arch qwen2.5-1.5b,llama-3.2-1b] [--methods lora,full]
        [--seq 2048] [--rows 4] [--steps 10] [--warmup 3] [--compile] [--attn auto] [--fused-loss auto]
        [--arms padded,rayft] [--json out.json]
    python benchmarks/bench_gpu_step.py --device cpu --arch qwen2-tiny --seq 256 --steps 2 --warmup 1  # smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

H100_BF16_TFLOPS = 989.0


@dataclass
class Result:
    """One arm of one architecture and method."""

    arch: str
    method: str
    arm: str
    attention: str
    loss: str
    tokens_per_s: float
    mfu: float | None
    peak_gib: float | None
    final_loss: float


def gsm8k_like_examples(count: int, seed: int, vocab: int) -> list[dict[str, Any]]:
    """Examples with GSM8K-like prompt and answer lengths, labels on the answer only."""
    from rayft.data.prepared import IGNORE_INDEX

    rng = random.Random(seed)
    examples = []
    for index in range(count):
        prompt = min(max(int(rng.gauss(110, 35)), 40), 300)
        answer = min(max(int(rng.gauss(120, 50)), 30), 400)
        ids = [rng.randrange(10, vocab) for _ in range(prompt + answer)]
        labels = [IGNORE_INDEX] * prompt + ids[prompt:]
        examples.append({"input_ids": ids, "labels": labels, "position_ids": list(range(len(ids))),
                         "sample_ids": [index], "sample_id": index, "num_tokens": len(ids),
                         "num_label_tokens": answer})  # fmt: skip
    return examples


def packed_batches(examples: list[dict[str, Any]], seq: int, rows: int, steps: int, attn: str) -> list[list[Any]]:
    """Steps of one micro-batch each: ``rows`` packed rows of at most ``seq`` tokens, padded as
    training pads them for the attention kernel."""
    from rayft.data.collate import collate
    from rayft.data.packing import build_units, plan_packs
    from rayft.training.modeling.attention import row_multiple

    units = build_units(examples, plan_packs([len(e["input_ids"]) for e in examples], seq))
    multiple = row_multiple(attn)
    return [
        [collate(units[i : i + rows], pad_token_id=0, pad_to_multiple_of=multiple)]
        for i in range(0, rows * steps, rows)
    ]


def padded_batches(examples: list[dict[str, Any]], tokens_per_step: int, steps: int, slots: int) -> list[list[Any]]:
    """Steps of about ``tokens_per_step`` real tokens, one example per row, cut into micro-batches of
    at most ``slots`` padded positions (the packed arm's rows x seq): the same real tokens per optimizer
    step and the same activation budget per forward as the packed arm, gradients accumulated over the
    micro-batches (one micro-batch of a whole step's rows padded to the longest does not fit a GPU)."""
    from rayft.data.collate import collate

    result, step, size = [], [], 0
    for example in examples:
        step.append(example)
        size += len(example["input_ids"])
        if size >= tokens_per_step:
            result.append([collate(chunk, pad_token_id=0) for chunk in micro_batches_within(step, slots)])
            step, size = [], 0
            if len(result) == steps:
                break
    return result


def micro_batches_within(examples: list[dict[str, Any]], slots: int) -> list[list[dict[str, Any]]]:
    """Consecutive examples grouped so that rows x longest stays within ``slots`` positions."""
    chunks: list[list[dict[str, Any]]] = [[]]
    for example in examples:
        longest = max([len(e["input_ids"]) for e in chunks[-1]] + [len(example["input_ids"])])
        if chunks[-1] and longest * (len(chunks[-1]) + 1) > slots:
            chunks.append([])
        chunks[-1].append(example)
    return chunks


def best_attention(device_type: str) -> str:
    """flash_attention_2 where flash-attn is installed on CUDA, else sdpa."""
    import importlib.util

    if device_type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def flops_per_token(config: Any, method: str, linear: float, mean_context: float) -> float:
    """Model FLOPs per real token (see the module docstring); ``linear`` is N."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 12.0 * config.num_hidden_layers * config.num_attention_heads * head_dim * mean_context
    return (6 if method == "full" else 4) * linear + attention


def mean_context(examples: list[dict[str, Any]]) -> float:
    """The mean, over tokens, of the length of the example a token attends in."""
    lengths = [len(e["input_ids"]) for e in examples]
    return sum(n * n for n in lengths) / sum(lengths)


def build(arch: str, method: str, attention: str, device: Any, compile_blocks: bool) -> tuple[Any, Any, float]:
    """The model as a worker prepares it, its optimizer, and N (counted before the adapter)."""
    from rayft.config.model import LoraConfig, ModelConfig
    from rayft.config.train import TrainConfig
    from rayft.models.loading import resolve_dtype
    from rayft.testing.architectures import linear_parameters, random_model
    from rayft.training.loop.worker import build_optimizer
    from rayft.training.modeling.model import prepare_training_model, training_dtype

    dtype = resolve_dtype(training_dtype(ModelConfig(), method, device.type), device.type)  # type: ignore[arg-type]
    net = random_model(arch, dtype=dtype, device=device, attn_implementation=attention)
    linear = float(linear_parameters(net))
    net = prepare_training_model(net, LoraConfig(dropout=0.0), method, attention, device.type,  # type: ignore[arg-type]
                                 gradient_checkpointing=False, compile_blocks=compile_blocks)  # fmt: skip
    net.to(device)
    return net, build_optimizer(net, TrainConfig(learning_rate=1e-5)), linear


def run_arm(args: argparse.Namespace, arch: str, method: str, arm: str, batches: list[list[Any]]) -> Result:
    """Warm up, then time ``--steps`` optimizer steps of one arm."""
    import torch

    from rayft.training.loop.steps import step_options, train_step
    from rayft.training.modeling.precision import resolve_precision
    from rayft.training.strategies.table import parallelism

    device = torch.device(args.device)
    attention = (best_attention(device.type) if args.attn == "auto" else args.attn) if arm == "rayft" else "eager"
    fused = args.fused_loss if arm == "rayft" else "none"
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model, optimizer, linear = build(arch, method, attention, device, args.compile and arm == "rayft")
    options = step_options(attention, fused, device.type)
    precision = resolve_precision("auto", device.type)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    strategy = parallelism("ddp", 1)
    times, real_tokens, losses = [], [], []
    for index, host_batches in enumerate(batches[: args.warmup + args.steps]):
        step_batches = [batch.to(device) for batch in host_batches]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        stats = train_step(model, optimizer, scheduler, step_batches, parallel=strategy, precision=precision,
                           scaler=None, max_grad_norm=1.0, world_size=1, device=device, **options)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= args.warmup:
            times.append(time.perf_counter() - start)
            real_tokens.append(stats.real_tokens)
        losses.append(stats.loss)
    tokens_per_s = sum(real_tokens) / sum(times)
    flops = flops_per_token(model.config, method, linear, args.mean_context)
    mfu = tokens_per_s * flops / (args.peak_tflops * 1e12) if device.type == "cuda" else None
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    del model, optimizer
    gc.collect()
    return Result(arch, method, arm, attention, options["loss"], tokens_per_s, mfu, peak, losses[-1])


def table(results: list[Result]) -> str:
    """The results as one text table, with the packed/padded throughput ratio of each pair."""
    lines = [f"{'arch':<14}{'method':<7}{'arm':<8}{'attention':<19}{'loss':<9}{'tokens/s':>10}{'MFU':>7}"
             f"{'peak GiB':>10}{'vs padded':>11}"]  # fmt: skip
    padded = {(r.arch, r.method): r.tokens_per_s for r in results if r.arm == "padded"}
    for r in results:
        ratio = r.tokens_per_s / padded[(r.arch, r.method)] if (r.arch, r.method) in padded else None
        mfu = "" if r.mfu is None else f"{100 * r.mfu:.1f}%"
        peak = "" if r.peak_gib is None else f"{r.peak_gib:.1f}"
        versus = "" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"{r.arch:<14}{r.method:<7}{r.arm:<8}{r.attention:<19}{r.loss:<9}{r.tokens_per_s:>10.0f}"
                     f"{mfu:>7}{peak:>10}{versus:>11}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    """Run every architecture and method, both arms each, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-1.5b,llama-3.2-1b")
    parser.add_argument("--methods", default="lora,full")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=4, help="packed rows per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--attn", default="auto", help="the rayft arm's attention (auto, sdpa, flex_attention, ...)")
    parser.add_argument("--fused-loss", default="auto", help="the rayft arm's train.fused_loss (auto, chunked, none)")
    parser.add_argument("--arms", default="padded,rayft", help="which arms to run")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_TFLOPS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured (--device cpu --arch qwen2-tiny runs a smoke test)")
        return []
    from rayft.testing.architectures import architecture_config

    results = []
    for arch in args.arch.split(","):
        vocab = architecture_config(arch).vocab_size
        total = args.warmup + args.steps
        examples = gsm8k_like_examples(total * args.rows * args.seq // 150, seed=0, vocab=vocab)
        examples = [e for e in examples if e["num_tokens"] <= args.seq]
        args.mean_context = mean_context(examples)
        packed = packed_batches(examples, args.seq, args.rows, total, args.attn)
        real_per_step = sum(b.num_tokens for step in packed for b in step) // len(packed)
        padded = padded_batches(examples, real_per_step, total, args.seq * args.rows)
        for method in args.methods.split(","):
            for arm, batches in (("padded", padded), ("rayft", packed)):
                if arm not in args.arms.split(","):
                    continue
                result = run_arm(args, arch, method, arm, batches)
                results.append(result)
                print(f"  {arch} {method} {arm}: {result.tokens_per_s:.0f} tokens/s, loss {result.final_loss:.3f}",
                      flush=True)  # fmt: skip
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return results


if __name__ == "__main__":
    main()
