"""Preference training's cost against SFT on the same pairs: real tokens/s and pairs/s of DPO (LoRA,
its reference the model with the adapter off; full fine-tuning, its reference log-probabilities
stored), ORPO and SimPO, against SFT on the chosen side only (the baseline, measured in the same run).

Pairs are made from GSM8K train (the chosen response a problem's own answer, the rejected one the
next problem's answer) and prepared by rayft (`prepare` with preference pairs, in-process) with the
SmolLM2 tokenizer. Every arm runs rayft's own code for a step: the SFT loss (`token_loss_sum` on the
chosen rows) or the preference objective (`PreferenceTraining.loss_sum`), a backward pass and an
AdamW step, on a small random-init Llama with SmolLM2's vocabulary (the 135M model itself does
~100 tokens/s on these CPUs, too slow to measure several steps of each arm), fp32. The arms alternate
step by step after one warm-up step each; each arm's rate is its steps' real tokens (both sides for
a preference arm) over their time, the median of the repeats, with the ratio to SFT per repeat.

    .venv/bin/python benchmarks/bench_preference.py [--steps 3] [--repeats 3] [--pairs 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
MODEL = "smollm2-135m-instruct"
MAX_LEN = 512


def write_pairs(path: Path, count: int) -> Path:
    """GSM8K problems as pairs: the problem's own answer chosen, the next problem's answer rejected."""
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[: count + 1]]
    pairs = [{"prompt": a["question"], "chosen": a["answer"], "rejected": b["answer"]}
             for a, b in itertools.pairwise(rows)]  # fmt: skip
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def prepare_pairs(path: Path) -> tuple[Any, list[dict[str, Any]]]:
    """rayft's preparation of the pairs, and their units in file order."""
    import pyarrow.parquet as pq

    from rayft.config import load_config
    from rayft.data.preference import pair_preparation
    from rayft.data.prepare import prepare

    cfg = load_config(None, [f"model.name={MODEL}", f"data.datasets=[{{path: '{path}'}}]", "train.objective=dpo",
                             f"data.max_seq_length={MAX_LEN}", "data.validation_fraction=0"])  # fmt: skip
    pairs = pair_preparation(True, cfg.train.preference.max_prompt_length)
    prepared = prepare(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False, pairs=pairs).prepared
    return prepared, [row for f in prepared.train.files for row in pq.read_table(f).to_pylist()]


def build_model(vocab: int, hidden: int, layers: int, lora: bool) -> Any:
    """A random-init Llama with SmolLM2's vocabulary, with a LoRA adapter (r 16, every linear layer) if asked."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 4,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         num_key_value_heads=max(1, hidden // 128), max_position_embeddings=MAX_LEN,
                         tie_word_embeddings=True, attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config)
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))


def objective(name: str, pad_id: int) -> Any:
    """rayft's preference objective ``name`` with its default settings."""
    from rayft.config.preference import PreferenceConfig
    from rayft.training.methods.preference.method import PreferenceTraining

    plan = SimpleNamespace(model=SimpleNamespace(attn_implementation="sdpa"))
    lm = SimpleNamespace(plan=plan, tokenizer=SimpleNamespace(pad_token_id=pad_id), model_type="llama")
    return PreferenceTraining(lm, name, PreferenceConfig())  # type: ignore[arg-type]


def sft_step(model: Any, units: list[dict[str, Any]], pad_id: int) -> tuple[Any, int, int]:
    """The SFT loss on the chosen rows alone: (mean loss, real tokens, loss terms)."""
    from rayft.data.collate import collate
    from rayft.training.loop.steps import token_loss_sum
    from rayft.training.modeling.precision import Precision

    rows = [{"input_ids": u["chosen_input_ids"], "labels": u["chosen_labels"],
             "position_ids": list(range(len(u["chosen_input_ids"]))), "sample_ids": u["sample_ids"]}
            for u in units]  # fmt: skip
    micro = collate(rows, pad_id)
    return token_loss_sum(model, micro, Precision(None, False)), micro.num_tokens, micro.num_label_tokens


def pair_step(model: Any, units: list[dict[str, Any]], arm: Any) -> tuple[Any, int, int]:
    """A preference objective's loss on the pairs: (loss sum, real tokens of both sides, pairs)."""
    from rayft.training.modeling.precision import Precision

    batch = arm.collate(units)
    loss = arm.loss_sum(model, batch, Precision(None, False))
    arm.figure_sums.clear()
    return loss, batch.num_tokens, batch.pairs


def with_reference(model: Any, units: list[dict[str, Any]], pad_id: int) -> list[dict[str, Any]]:
    """``units`` with the reference log-probabilities of ``model`` stored, as full-fine-tuning DPO has them."""
    import torch

    from rayft.training.methods.preference.method import collate_preference, pair_logps
    from rayft.training.modeling.precision import Precision

    out = []
    with torch.no_grad():
        for start in range(0, len(units), 8):
            chunk = units[start : start + 8]
            logps = pair_logps(model, collate_preference(chunk, pad_id).rows, Precision(None, False))
            out += [{**u, "ref_chosen_logps": float(c), "ref_rejected_logps": float(r)}
                    for u, c, r in zip(chunk, logps.chosen, logps.rejected, strict=True)]  # fmt: skip
    return out


def timed(step: Any, optimizer: Any, pairs: int) -> tuple[int, int, float]:
    """(real tokens, ``pairs``, seconds) of one optimizer step on ``pairs`` pairs (their chosen side, for SFT)."""
    started = time.perf_counter()
    loss, tokens, terms = step()
    (loss / max(terms, 1)).backward()  # the mean over the loss terms: label tokens (SFT) or pairs
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return tokens, pairs, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured optimizer steps per arm and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=4, help="pairs per micro-batch (one step)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    import torch

    os.environ.setdefault("RAYFT_DATA_CACHE", str(Path(tempfile.gettempdir()) / "rayft-bench-data"))
    needed = args.pairs * (args.steps * args.repeats + 1)
    with tempfile.TemporaryDirectory() as scratch:
        prepared, units = prepare_pairs(write_pairs(Path(scratch) / "pairs.jsonl", needed + 16))
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer

    pad = load_tokenizer(ModelConfig(name=MODEL)).pad_token_id
    vocab = len(load_tokenizer(ModelConfig(name=MODEL)))
    models = {"lora": build_model(vocab, args.hidden, args.layers, lora=True),
              "full": build_model(vocab, args.hidden, args.layers, lora=False)}  # fmt: skip
    stored = with_reference(models["full"], units[:needed], pad)
    arms = {
        "sft (lora)": ("lora", lambda b: sft_step(models["lora"], b, pad), units),
        "dpo (lora)": ("lora", lambda b: pair_step(models["lora"], b, objective("dpo", pad)), units),
        "orpo (lora)": ("lora", lambda b: pair_step(models["lora"], b, objective("orpo", pad)), units),
        "simpo (lora)": ("lora", lambda b: pair_step(models["lora"], b, objective("simpo", pad)), units),
        "sft (full)": ("full", lambda b: sft_step(models["full"], b, pad), units),
        "dpo (full)": ("full", lambda b: pair_step(models["full"], b, objective("dpo", pad)), stored),
    }
    optimizers = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-6)
                  for name, m in models.items()}  # fmt: skip
    measured: dict[str, list[tuple[int, int, float]]] = {name: [] for name in arms}
    for step in range(args.steps * args.repeats + 1):
        for name, (kind, run, data) in arms.items():
            batch = data[step * args.pairs : (step + 1) * args.pairs]
            result = timed(lambda run=run, batch=batch: run(batch), optimizers[kind], len(batch))
            if step > 0:
                measured[name].append(result)
    report(measured, args, prepared)


def report(measured: dict[str, list[tuple[int, int, float]]], args: Any, prepared: Any) -> None:
    """Rates per arm (median of repeats) and the ratio to SFT of the same method, per repeat."""
    import torch

    def rates(name: str, index: int) -> list[float]:
        steps = measured[name]
        cut = [steps[r * args.steps : (r + 1) * args.steps] for r in range(args.repeats)]
        return [sum(s[index] for s in part) / sum(s[2] for s in part) for part in cut]

    print(f"\nGSM8K pairs: {prepared.train.num_units} prepared, {args.pairs} per step, SmolLM2 tokenizer, "
          f"max_seq_length {MAX_LEN}; {args.repeats} repeats of {args.steps} steps per arm")  # fmt: skip
    for name in measured:
        method = name.split("(")[1].rstrip(")")
        tokens, pairs = rates(name, 0), rates(name, 1)
        base_tokens, base_pairs = rates(f"sft ({method})", 0), rates(f"sft ({method})", 1)
        token_ratio = statistics.median(t / b for t, b in zip(tokens, base_tokens, strict=True))
        pair_ratio = statistics.median(t / b for t, b in zip(pairs, base_pairs, strict=True))
        print(f"  {name:13s} {statistics.median(tokens):8.0f} real tokens/s ({token_ratio:.2f}x sft)  "
              f"{statistics.median(pairs):6.2f} pairs/s ({pair_ratio:.2f}x sft)")  # fmt: skip
    print(f"  model: random-init Llama, hidden {args.hidden}, {args.layers} layers, fp32, {torch.get_num_threads()} "
          f"torch threads; load {os.getloadavg()}")  # fmt: skip
    print(f"  command: .venv/bin/python benchmarks/bench_preference.py --steps {args.steps} --repeats {args.repeats} "
          f"--pairs {args.pairs} --hidden {args.hidden} --layers {args.layers}")  # fmt: skip


if __name__ == "__main__":
    main()
