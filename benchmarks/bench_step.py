"""The training step's default path against each alternative, on the same rows, in one run (CPU).

SmolLM2-135M-Instruct (rayft's offline copy) is trained for a few optimizer steps per arm on real GSM8K
rows (``Question: ...\\nAnswer:`` then the answer, loss on the answer), each arm in a fresh process
(peak memory is its own), with rayft's own step (:func:`rayft.training.loop.steps.train_step`, the
single-worker strategy, the model prepared by :func:`rayft.training.modeling.model.prepare_training_model`):

- ``baseline``: one example per row, padded to the longest of the micro-batch, eager attention, the
  plain loss (all kept logits, then cross-entropy), fp32;
- ``padding-free``: the baseline's micro-batches with their examples laid end to end in one row (no padding),
  per-example SDPA, the chunked loss;
- ``sdpa-chunked``: examples packed into rows of ``--seq`` tokens, SDPA (per example on CPU), the chunked loss;
- ``sdpa-plain``: packed, SDPA, the plain loss;
- ``flex-plain``: packed, flex_attention (skipped where it does not run), the plain loss;
- ``sdpa-chunked-compile``: ``sdpa-chunked`` with every block compiled (its first steps compile);
- ``sdpa-plain-bf16``, ``sdpa-chunked-bf16``, ``padding-free-bf16``: those arms under bf16 autocast (CPUs
  with bf16 instructions);
- ``padding-free-frozen-bf16``: ``padding-free`` with LoRA's frozen base layers stored and multiplied in bf16,
  the rest in fp32 (``train.frozen_precision: bf16``; LoRA only);
- ``default``: what :func:`rayft.training.modeling.step_choice.choose_step` picks for this machine, for
  unpacked data (``data.packing: false``, the TRL comparison's setting) unless ``--packing``.

The padded arm's micro-batches hold the same examples as the packed arm's, with at most ``--rows x --seq``
padded positions each, gradients accumulated to the same real tokens per optimizer step. Tokens/s counts
real tokens over the timed steps (after ``--warmup``), and per CPU-second of the process (less sensitive to
other work on the machine); every arm runs the same thread count (the default's, or ``--threads``).

    flock /tmp/rayft-bench.lock .venv/bin/python benchmarks/bench_step.py [--methods lora,full] [--seq 512]
        [--rows 2] [--steps 3] [--warmup 1] [--arms baseline,sdpa-chunked,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
if not GSM8K.exists():
    GSM8K = Path("/work/shared/datasets/gsm8k/train.jsonl")

# name: (layout, attention, loss, compile, bf16 autocast, frozen layers in bf16)
Arm = tuple[str, str, str, bool, bool, bool]
ARMS: dict[str, Arm] = {
    "baseline": ("padded", "eager", "none", False, False, False),
    "padding-free": ("padding-free", "sdpa", "chunked", False, False, False),
    "sdpa-chunked": ("packed", "sdpa", "chunked", False, False, False),
    "sdpa-plain": ("packed", "sdpa", "none", False, False, False),
    "flex-plain": ("packed", "flex_attention", "none", False, False, False),
    "sdpa-chunked-compile": ("packed", "sdpa", "chunked", True, False, False),
    "sdpa-plain-bf16": ("packed", "sdpa", "none", False, True, False),
    "sdpa-chunked-bf16": ("packed", "sdpa", "chunked", False, True, False),
    "padding-free-bf16": ("padding-free", "sdpa", "chunked", False, True, False),
    "padding-free-frozen-bf16": ("padding-free", "sdpa", "chunked", False, False, True),
}

ARM = r"""
import json, resource, sys, time
sys.path.insert(0, "benchmarks")
import torch
from bench_step import examples_of, step_batches
from rayft.config.model import LoraConfig, ModelConfig
from rayft.config.train import TrainConfig
from rayft.models.loading import load_causal_lm
from rayft.training.loop.steps import train_step
from rayft.training.loop.worker import build_optimizer
from rayft.training.modeling.attention import training_attention, uses_varlen
from rayft.training.modeling.model import prepare_training_model
from rayft.training.modeling.precision import Precision
from rayft.training.strategies.table import parallelism
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
torch.manual_seed(0)
net = load_causal_lm(ModelConfig(dtype="float32", attn_implementation=spec["attention"]), "cpu")
batches = step_batches(examples_of(spec["examples"]), spec)
net = prepare_training_model(net, LoraConfig(dropout=0.0), spec["method"], spec["attention"], "cpu",
                             gradient_checkpointing=False, compile_blocks=spec["compile"],
                             frozen_bf16=spec["frozen_bf16"] and spec["method"] == "lora")
optimizer = build_optimizer(net, TrainConfig(learning_rate=1e-4))
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
precision = Precision(torch.bfloat16 if spec["bf16"] else None, False)
varlen = uses_varlen(training_attention(spec["attention"], "cpu"))
times, cpu, tokens, losses = [], [], [], []
for index, step in enumerate(batches):
    start, start_cpu = time.perf_counter(), time.process_time()
    stats = train_step(net, optimizer, scheduler, step, parallel=parallelism("ddp", 1), precision=precision,
                       scaler=None, max_grad_norm=1.0, world_size=1, device=torch.device("cpu"),
                       loss=spec["loss"], varlen=varlen)
    if index >= spec["warmup"]:
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        tokens.append(stats.real_tokens)
    losses.append(stats.loss)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"tokens_per_s": sum(tokens) / sum(times), "tokens_per_cpu_s": sum(tokens) / sum(cpu),
                  "peak_mib": peak, "losses": losses}))
"""


def gsm8k_rows(count: int) -> list[dict[str, Any]]:
    """The first ``count`` GSM8K training problems, tokenized as prompt and answer (labels on the answer)."""
    from rayft.config.model import ModelConfig
    from rayft.data.prepared import IGNORE_INDEX
    from rayft.models.loading import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig())
    rows = []
    for index, line in enumerate(GSM8K.read_text().splitlines()[:count]):
        problem = json.loads(line)
        prompt = tokenizer(f"Question: {problem['question']}\nAnswer:")["input_ids"]
        answer = tokenizer(" " + problem["answer"])["input_ids"] + [tokenizer.eos_token_id]
        ids = prompt + answer
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * len(prompt) + answer,
                     "position_ids": list(range(len(ids))), "sample_ids": [index], "sample_id": index,
                     "num_tokens": len(ids), "num_label_tokens": len(answer)})  # fmt: skip
    return rows


def examples_of(path: str) -> list[dict[str, Any]]:
    """The tokenized rows the driver wrote for the arms."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def step_batches(examples: list[dict[str, Any]], spec: dict[str, Any]) -> list[list[Any]]:
    """The arm's optimizer steps: packed rows of ``seq`` tokens, or the same examples padded (or laid end to
    end in one row per micro-batch), per step."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_gpu_step import packed_batches, padded_batches
    from rayft.data.collate import collate, end_to_end

    total = spec["warmup"] + spec["steps"]
    examples = [e for e in examples if e["num_tokens"] <= spec["seq"]]
    packed = packed_batches(examples, spec["seq"], spec["rows"], total, spec["attention"])
    layout = spec.get("layout") or ("packed" if spec["packed"] else "padded")
    if layout == "packed":
        return packed
    real_per_step = sum(b.num_tokens for step in packed for b in step) // len(packed)
    padded = padded_batches(examples, real_per_step, total, spec["seq"] * spec["rows"])
    if layout == "padded":
        return padded
    by_id = {e["sample_id"]: e for e in examples}
    return [[collate([end_to_end([by_id[i] for i in b.sample_ids])], pad_token_id=0) for b in step] for step in padded]


def default_arm(method: str, seq: int, rows: int, packing: bool) -> tuple[Arm, int, str]:
    """The arm the step's planner picks on this machine for ``auto`` settings, its threads and its reason."""
    from rayft.training.modeling.step_choice import StepRequest, choose_step
    from rayft.training.modeling.step_facts import gather_step_facts

    facts = gather_step_facts(
        "cpu", method=method, hidden_size=576, num_layers=30, vocab_size=49152, seq_length=seq,
        micro_batch_size=rows, packing=packing, cpus=os.cpu_count() or 1,
    )  # fmt: skip
    choice = choose_step(StepRequest(), facts)
    layout = "packed" if packing else "padded"
    arm = (
        "padding-free" if choice.padding_free else layout,
        choice.attention,
        choice.loss,
        choice.compile,
        choice.mixed_precision == "bf16",
        choice.frozen_precision == "bf16",
    )
    return arm, choice.threads or 1, choice.describe()


def arms_label(arm: Arm) -> str:
    """An arm's settings in a few words."""
    layout, attention, loss, compiled, bf16, frozen = arm
    return (f"{layout} {attention} {loss}{' compiled' if compiled else ''}{' bf16' if bf16 else ''}"
            f"{' frozen-bf16' if frozen else ''}")  # fmt: skip


def run_arm(spec: dict[str, Any]) -> dict[str, Any] | str:
    """One arm in a fresh process: its figures, or why it did not run."""
    done = subprocess.run([sys.executable, "-c", ARM, json.dumps(spec)], check=False, capture_output=True,
                          text=True, cwd=REPO)  # fmt: skip
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else f"exit {done.returncode}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Every arm of every method on the same rows; the ratios to the baseline as one table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="lora,full")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2, help="packed rows per micro-batch (one per step)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--arms", default=",".join([*ARMS, "default"]))
    parser.add_argument("--examples", type=int, default=200, help="GSM8K rows to tokenize")
    parser.add_argument("--packing", action="store_true", help="the default arm plans for packed data")
    parser.add_argument("--threads", type=int, help="threads of every arm (default: the default arm's choice)")
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    print("load:", Path("/proc/loadavg").read_text().split()[:3], flush=True)
    rows_file = Path(tempfile.mkstemp(prefix="bench-step-rows-", suffix=".jsonl")[1])
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(args.examples)))
    for method in args.methods.split(","):
        chosen, threads, why = (
            default_arm(method, args.seq, args.rows, args.packing)
            if "default" in args.arms
            else (ARMS["baseline"], 1, "")
        )
        threads = args.threads or threads
        print(f"{method}: default = {arms_label(chosen)}: {why}; every arm runs {threads} thread(s)", flush=True)
        arms = {**ARMS, "default": chosen}
        results: dict[str, dict[str, Any] | str] = {}
        for name in args.arms.split(","):
            layout, attention, loss, compiled, bf16, frozen = arms[name]
            spec = {"method": method, "layout": layout, "attention": attention, "loss": loss, "compile": compiled,
                    "bf16": bf16, "frozen_bf16": frozen, "threads": threads, "seq": args.seq, "rows": args.rows,
                    "steps": args.steps, "warmup": args.warmup, "examples": str(rows_file)}  # fmt: skip
            results[name] = run_arm(spec)
            print(f"  {method} {name}: {results[name]}", flush=True)
        print(table(method, results), flush=True)
    print("load:", Path("/proc/loadavg").read_text().split()[:3], flush=True)
    rows_file.unlink()


def table(method: str, results: dict[str, dict[str, Any] | str]) -> str:
    """One line per arm: tokens/s and per CPU-second with their ratios to the baseline, peak RSS, losses."""
    base = results.get("baseline")
    lines = [f"{'method':<6} {'arm':<26}{'tokens/s':>10}{'vs base':>9}{'tok/CPU-s':>11}{'vs base':>9}{'peak MiB':>10}"
             "  losses (first, last)"]  # fmt: skip
    for name, result in results.items():
        if isinstance(result, str):
            lines.append(f"{method:<6} {name:<26} did not run: {result}")
            continue
        wall = f"{result['tokens_per_s'] / base['tokens_per_s']:.2f}x" if isinstance(base, dict) else "-"
        cpu = f"{result['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f}x" if isinstance(base, dict) else "-"
        losses = result["losses"]
        per_s, per_cpu = result["tokens_per_s"], result["tokens_per_cpu_s"]
        lines.append(f"{method:<6} {name:<26}{per_s:>10.1f}{wall:>9}{per_cpu:>11.1f}"
                     f"{cpu:>9}{result['peak_mib']:>10.0f}  {losses[0]:.4f}, {losses[-1]:.4f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
