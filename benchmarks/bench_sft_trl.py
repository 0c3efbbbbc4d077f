"""rayft's SFT against TRL's ``SFTTrainer`` on identical work: wall time, tokens/s, peak memory, held-out loss.

Both arms train a LoRA adapter (r 16, alpha 32, dropout 0.05, every linear layer) on SmolLM2-135M-Instruct
(rayft's offline copy) over the first ``--rows`` GSM8K training problems as raw-text prompt and completion
(``Question: ...\\nAnswer:`` then `` <answer>`` and EOS, loss on the completion), unpacked, one epoch of
micro-batches of 4 (no accumulation), AdamW at 2e-4 with cosine decay to 0, no warmup, gradient norm clipped
at 1, the rows in file order (no shuffling), no evaluation or checkpoint during training. rayft runs its
own loop in-process (``scaling.num_workers=0``: the data preparation and the loop in one process, no Ray
Train worker), TRL its trainer; each arm runs in a fresh process, one after the other, so that each peak is its own.

Arms: ``rayft`` (its ``auto`` step, which chooses the precisions), ``rayft-fp32`` and ``rayft-bf16`` (the
autocast precision set), ``rayft-frozen-fp32`` (the ``auto`` step with the frozen base layers' products kept
in fp32: ``train.frozen_precision=fp32``), ``trl`` (fp32, its default on CPU) and ``trl-bf16`` (``bf16=True``:
CPU autocast). The summary compares ``rayft`` with ``trl``, and every other arm present with it as well.

Figures per arm: wall time of ``train`` (rayft: data preparation included; TRL: dataset tokenization
included), real tokens trained per second of it, the process's peak resident set (and what it held at the
end of each phase: imports, model built, after the first step, after the last), and the held-out loss: the
mean answer-token cross-entropy of the trained adapter over the next ``--heldout`` GSM8K problems, computed
by the same function in both arms.

    flock /tmp/rayft-bench.lock .venv/bin/python benchmarks/bench_sft_trl.py [--rows 160] [--heldout 40]
        [--arms rayft,trl[,rayft-fp32,rayft-bf16,rayft-frozen-fp32,trl-bf16]] [--threads 2] [--rayft-set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
if not GSM8K.exists():
    GSM8K = Path("/work/shared/datasets/gsm8k/train.jsonl")
MODEL = "smollm2-135m-instruct"
LR, BATCH, SEQ = 2e-4, 4, 512


class Memory:
    """The process's resident set, sampled every 50 ms, with the peak of each named phase."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.phase = "imports"
        self.peaks: dict[str, float] = {}
        self.stopped = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def enter(self, phase: str) -> None:
        """Count the samples from now on towards ``phase``."""
        self._record()
        self.phase = phase

    def _record(self) -> None:
        rss = self.process.memory_info().rss / 2**20
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)

    def _sample(self) -> None:
        while not self.stopped.wait(0.05):
            self._record()


def problems(start: int, count: int) -> list[dict[str, str]]:
    """GSM8K training problems ``start`` to ``start + count``."""
    return [json.loads(line) for line in GSM8K.read_text().splitlines()[start : start + count]]


def heldout_loss(model: Any, tokenizer: Any, rows: list[dict[str, str]]) -> float:
    """Mean cross-entropy of the answer tokens (and EOS) of ``rows`` given their prompts, fp32, one row at a time."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            prompt = tokenizer(f"Question: {row['question']}\nAnswer:")["input_ids"]
            answer = tokenizer(" " + row["answer"])["input_ids"] + [tokenizer.eos_token_id]
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))
            count += len(answer)
    return total / count


def run_rayft(
    work: Path, rows: list[dict[str, str]], memory: Memory, precision: str, overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    """rayft in-process with ``train.mixed_precision=precision``; tokens from its metrics, the adapter from final/."""
    import rayft
    from rayft.config import load_config
    from rayft.training.loop import worker

    data = work / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [
        f"model.name={MODEL}", f"storage_path={work}", "name=rayft-sft", "scaling.num_workers=0",
        f"data.datasets=[{{path: '{data}', format: template, use_chat_template: false, "
        "input_template: 'Question: {question}\\nAnswer:', output_template: ' {answer}'}]",
        "data.packing=false", "data.validation_fraction=0", "data.shuffle_buffer_size=1", f"data.max_seq_length={SEQ}",
        f"data.cache_dir={work / 'cache'}", "train.num_epochs=1", f"train.micro_batch_size={BATCH}",
        f"train.learning_rate={LR}", "train.warmup_steps=0", "train.eval_steps=null", "train.save_steps=100000",
        "train.logging_steps=1", "lora.r=16", "lora.alpha=32", "lora.dropout=0.05", "lora.target_modules=all-linear",
        "logging.tensorboard=false", "checkpoint.num_to_keep=1", f"train.mixed_precision={precision}", *overrides,
    ])  # fmt: skip
    phases(worker, memory)
    start = time.perf_counter()
    run = rayft.api.train(cfg)
    elapsed = time.perf_counter() - start
    memory.enter("held-out loss")
    records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = sum(r["train/tokens_per_s"] * r["time/step"] for r in records if "train/loss" in r)
    return {"wall_s": elapsed, "steps": run.steps, "tokens": tokens, "trained": lambda: load_adapter(run.final_dir)}


def phases(worker: Any, memory: Memory) -> None:
    """Mark rayft's phases (model build, first step, the rest) by wrapping the loop's own functions."""
    setup, step = worker.setup_worker, worker.run_step

    def timed_setup(*args: Any, **kwargs: Any) -> Any:
        memory.enter("model built")
        result = setup(*args, **kwargs)
        memory.enter("first step")
        return result

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        result = step(*args, **kwargs)
        memory.enter("later steps")
        return result

    worker.setup_worker, worker.run_step = timed_setup, timed_step


def load_adapter(directory: Path) -> tuple[Any, Any]:
    """The base model with the trained adapter of ``directory``, and its tokenizer."""
    from peft import PeftModel

    from rayft.config.model import ModelConfig
    from rayft.models.loading import load_causal_lm, load_tokenizer

    cfg = ModelConfig(name=MODEL, dtype="float32")
    return PeftModel.from_pretrained(load_causal_lm(cfg), str(directory)), load_tokenizer(cfg)


def run_trl(work: Path, rows: list[dict[str, str]], memory: Memory, bf16: bool) -> dict[str, Any]:
    """TRL's ``SFTTrainer`` on the same rows, in the same order, and settings; tokens counted from its batches."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from rayft.models.loading import ensure_builtin_model

    model_dir = str(ensure_builtin_model(MODEL))
    counted = {"tokens": 0.0}

    class Marks(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            memory.enter("first step")

        def on_step_end(self, *_: Any, **__: Any) -> None:
            memory.enter("later steps")

    dataset = Dataset.from_list([
        {"prompt": f"Question: {r['question']}\nAnswer:", "completion": " " + r["answer"]} for r in rows
    ])  # fmt: skip
    config = SFTConfig(
        output_dir=str(work / "trl"), use_cpu=True, bf16=bf16, report_to=[], save_strategy="no", logging_steps=1,
        num_train_epochs=1, learning_rate=LR, lr_scheduler_type="cosine", warmup_steps=0,
        per_device_train_batch_size=BATCH, gradient_accumulation_steps=1, max_grad_norm=1.0, weight_decay=0.0,
        max_length=SEQ, packing=False, padding_free=False, completion_only_loss=True, shuffle_dataset=False,
        seed=0, gradient_checkpointing=False, dataloader_num_workers=0, train_sampling_strategy="sequential",
    )  # fmt: skip
    peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    memory.enter("model built")
    start = time.perf_counter()
    trainer = SFTTrainer(model=model_dir, args=config, train_dataset=dataset, peft_config=peft, callbacks=[Marks()])
    collate = trainer.data_collator

    def counting(examples: list[Any]) -> Any:
        batch = collate(examples)
        counted["tokens"] += float(batch["attention_mask"].sum()) if "attention_mask" in batch else 0.0
        return batch

    trainer.data_collator = counting
    trainer.train()
    elapsed = time.perf_counter() - start
    memory.enter("held-out loss")
    return {"wall_s": elapsed, "steps": trainer.state.global_step, "tokens": counted["tokens"],
            "trained": lambda: (trainer.model, trainer.processing_class)}  # fmt: skip


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """One arm in this process: train, then the held-out loss; figures as a dict."""
    memory = Memory()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix=f"bench-sft-{arm}-") as work:
        rows = problems(0, args.rows)
        if arm.startswith("rayft"):
            # 'no' quoted: the override is read as YAML, where a bare no is false
            precision = {"rayft": "auto", "rayft-fp32": "'no'", "rayft-bf16": "bf16", "rayft-frozen-fp32": "auto"}[arm]
            frozen = ("train.frozen_precision=fp32",) if arm == "rayft-frozen-fp32" else ()
            trained = run_rayft(Path(work), rows, memory, precision, (*frozen, *args.rayft_set))
        else:
            trained = run_trl(Path(work), rows, memory, bf16=arm == "trl-bf16")
        train_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        loss = heldout_loss(*trained["trained"](), problems(args.rows, args.heldout))
    memory.stopped.set()
    return {"arm": arm, "wall_s": trained["wall_s"], "steps": trained["steps"], "tokens": trained["tokens"],
            "tokens_per_s": trained["tokens"] / trained["wall_s"], "peak_mib": train_peak,
            "phase_peaks_mib": memory.peaks, "heldout_loss": loss}  # fmt: skip


def main() -> None:
    """Each arm in a fresh process, one after the other; ratios of rayft to TRL."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--heldout", type=int, default=40)
    parser.add_argument("--arms", default="rayft,trl")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rayft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the rayft arms (repeatable)")  # fmt: skip
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # inside an arm's own process
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args)))
        return
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    results = {}
    for arm in args.arms.split(","):
        print("load:", Path("/proc/loadavg").read_text().split()[:3], flush=True)
        command = [sys.executable, __file__, "--arm", arm, "--rows", str(args.rows), "--heldout", str(args.heldout),
                   "--threads", str(args.threads), *(f"--rayft-set={o}" for o in args.rayft_set)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO, env=env)
        if done.returncode != 0:
            raise SystemExit(f"the {arm} arm failed:\n{done.stderr[-4000:]}")
        results[arm] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(results[arm]), flush=True)
    print("load:", Path("/proc/loadavg").read_text().split()[:3], flush=True)
    if "trl" in results:
        theirs = results["trl"]
        for name, ours in results.items():
            if name != "trl":
                print(f"{name}/trl: wall time {ours['wall_s'] / theirs['wall_s']:.2f}x ({ours['wall_s']:.0f} vs "
                      f"{theirs['wall_s']:.0f} s); tokens/s {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x; peak "
                      f"RSS {ours['peak_mib'] / theirs['peak_mib']:.2f}x ({ours['peak_mib']:.0f} vs "
                      f"{theirs['peak_mib']:.0f} MiB); held-out loss {ours['heldout_loss']:.4f} vs "
                      f"{theirs['heldout_loss']:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
