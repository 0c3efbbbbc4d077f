"""Where a training worker's memory goes: each Ray Train worker's peak resident set against the model's own
footprint, and the rest split into its parts, as measured.

Each arm runs a real ``rayft`` training in a fresh process (a local Ray started by rayft, Ray Train workers with
``scaling.num_workers`` 2 or 1): SmolLM2-135M-Instruct (rayft's offline copy) on the first GSM8K training
problems, rows of at most 256 tokens, unpacked, ``--steps`` optimizer steps, on CPU (fp32 but for LoRA's frozen
layers, ``--frozen-fp32`` below), nothing saved before the end. ``--methods`` picks the arms:

- ``lora`` and ``full``: supervised fine-tuning on each problem as prompt and completion (rows cut to 256 tokens),
  micro-batches of 4, LoRA (r 16 on every linear layer, the defaults) or full fine-tuning;
- ``grpo``: ``train.objective: grpo`` as ``configs/gsm8k-grpo.yaml`` sets it (its question and answer templates
  through the chat template, LoRA r 16, DAPO's loss, KL off, so no reference log-probabilities), 2 prompts per
  worker and step, 8 completions of each of at most 48 tokens sampled in the worker (colocated), 4 completions per
  forward pass, the math reward alone (it reads the reference's ``#### N`` line: a problem over 256 tokens is
  dropped, not cut, and three times the rows the steps read are written).

A loop callback (:class:`WorkerMemory`, ``train.callbacks``) in every worker measures, in that worker:

- its resident set: peak (``VmHWM``) after the model and optimizer are built, and over the whole run;
- the tensors Python can reach (``gc``), by unique storage, after the model is built and after step 1: frozen
  weights, trained parameters (the adapter, or every weight in full fine-tuning), and the rest (after step 1:
  AdamW's two moments, and under DDP its all-reduce buckets, which the gradients are views of; after the build,
  any tensor the load left behind, e.g. a state dict);
- the C heap (glibc ``mallinfo2``: bytes in use, and bytes freed but kept by the allocator) sampled every 20 ms,
  and, during step ``--profile-step`` (2 by default), read after every torch operator (a ``TorchDispatchMode``):
  the heap's peak above its level at the start of that step is the step's working set (activations saved for the
  backward pass, the gradients, the loss's chunks, temporaries; in GRPO also the sampling's key-value cache and
  logits), measured live, not computed;
- that step split where its training begins (the first operator under grad mode with a parameter among its
  inputs: the first forward pass that trains; the loop calls no callback there). Before it, GRPO's rollout:
  sampling under ``no_grad``, the rewards, the training rows; its "rollout working set" is the heap's peak above
  the step's start before that point, "rollout left in use" the heap still in use there above the start (the
  completions' rows, what the rollout did not free), and the "training working set" the peak above the step's
  start from there to the step's end; ``VmHWM`` is read at the step's start, where its training begins and at
  its end (which part raised the peak). For supervised arms the rollout's share is ~0; the split is printed for
  GRPO's arms only, in a second table;
- the largest resident set among the 20 ms samples (``VmRSS``), when it was ("step N", or "after step N":
  its logging, saving, and after the last step the final save), and the heap in use and kept free at that sample
  (the rest, "not heap": imports' code and data, file pages such as the weights' load, thread stacks); and
  ``VmHWM`` after each step;
- Arrow's memory pool (the data rows it reads) at its peak sample.

Beside the workers: the resident set of a fresh process that imports what a worker imports (torch,
transformers, peft, Ray Train, rayft's loop), and TRL's ``SFTTrainer`` on the same LoRA work in one process
(``bench_sft_trl.py``'s arm, 256-token rows, as many rows as ``--steps`` micro-batches of 4). The remainder
of a worker's peak is what none of the measured parts explain: the allocator's kept free memory at the peak,
and what is neither heap nor import (thread stacks, Ray's object store client, torch's own pools).

Each training runs on glibc's allocator twice (``train.allocator=glibc``): "before", with glibc's own mmap
threshold (``train.malloc_mmap_threshold_bytes=null``), and "after", with a fixed 1 MiB threshold
(``train.malloc_mmap_threshold_bytes=1048576``; ``--skip-after`` leaves it out); and, where jemalloc is
installed, a third time with ``train.allocator=jemalloc`` (``--skip-jemalloc`` leaves it out), whose heap is
not glibc's: its working sets, kept memory and remainder are not read ("n/a"). ``--trim-steps`` adds an arm on
glibc's default that calls ``malloc_trim(0)`` after every step (the callback, in the worker), which hands the
heap's free pages back to the system. ``--frozen-fp32`` adds an arm on glibc's default with LoRA's frozen
layers in fp32 (``train.frozen_precision=fp32``; the default stores and multiplies them in bf16 on CPUs with
bf16 instructions). The ratio is each worker's peak against its "before" peak.
``--env`` adds an arm with glibc's threshold and extra environment variables for the workers
(``KEY=VALUE,KEY=VALUE``, e.g. ``MALLOC_ARENA_MAX=2``). An arm that fails is reported and the others still run;
the run then exits non-zero.

    flock /tmp/rayft-bench.lock .venv/bin/python benchmarks/bench_worker_memory.py [--steps 4]
        [--methods lora,full,grpo] [--workers 2,1] [--profile-step 2] [--trl] [--skip-after]
        [--skip-jemalloc] [--trim-steps] [--env MALLOC_ARENA_MAX=2]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
if not GSM8K.exists():
    GSM8K = Path("/work/shared/datasets/gsm8k/train.jsonl")
MODEL = "smollm2-135m-instruct"
BATCH, SEQ = 4, 256
MIB = 2**20
BEFORE = "before: glibc's default"
AFTER = "after: 1 MiB mmap threshold"
JEMALLOC = "jemalloc"
TRIMMED = "glibc's default, malloc_trim(0) after each step"
FROZEN_FP32 = "glibc's default, frozen layers in fp32"
TRIM_ENV = "RAYFT_BENCH_TRIM_EACH_STEP"
GLIBC_HEAP_PARTS = ("step working set", "allocator kept free", "unexplained")  # read from glibc's mallinfo2


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


def heap() -> tuple[int, int]:
    """glibc's heap: bytes in use (arenas and mmapped blocks) and bytes freed but kept in the arenas."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reachable_tensors() -> dict[str, int]:
    """Bytes of the tensors Python can reach, each storage counted once: frozen parameters, trained ones, the rest."""
    import torch

    seen: set[int] = set()
    sizes = {"frozen": 0, "trained": 0, "other": 0}
    with warnings.catch_warnings():  # isinstance() on torch's deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        if obj.device.type != "cpu" or obj.is_meta:
            continue
        with contextlib.suppress(RuntimeError):  # a tensor without storage (sparse, wrapper subclasses)
            storage = obj.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() == 0:
                continue
            seen.add(storage.data_ptr())
            kind = "other"
            if isinstance(obj, torch.nn.Parameter):
                kind = "trained" if obj.requires_grad else "frozen"
            sizes[kind] += storage.nbytes()
    return sizes


class WorkerMemory:
    """A loop callback that measures its worker's memory (see the module's docstring) into ``out/rank-N.json``."""

    def __init__(self, out: str, profile_step: int = 2) -> None:
        import pyarrow

        self.out, self.profile_step, self.pool = Path(out), profile_step, pyarrow.default_memory_pool()
        self.figures: dict[str, Any] = {"built_hwm_mib": status_kib("VmHWM") / 1024,
                                        "built_rss_mib": status_kib("VmRSS") / 1024, "arrow_peak_mib": 0.0,
                                        "heap_peak_mib": 0.0, "heap_free_at_peak_mib": 0.0, "hwm_by_step_mib": [],
                                        "rss_peak": {"rss_mib": 0.0}}  # fmt: skip
        self.figures["built_tensors_mib"] = {k: v / MIB for k, v in reachable_tensors().items()}
        self.mode: Any = None
        self.rank = 0
        self.where = "build"  # the part of the run the sampler sees: "step N", or "after step N" (logging, saving)
        self.stopped = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.stopped.wait(0.02):
            used, free = heap()
            if used / MIB > self.figures["heap_peak_mib"]:
                self.figures["heap_peak_mib"], self.figures["heap_free_at_peak_mib"] = used / MIB, free / MIB
            self.figures["arrow_peak_mib"] = max(self.figures["arrow_peak_mib"], self.pool.max_memory() / MIB)
            rss = status_kib("VmRSS") / 1024
            if rss > self.figures["rss_peak"]["rss_mib"]:  # replaced whole: write() may be dumping the figures
                self.figures["rss_peak"] = {"rss_mib": rss, "heap_used_mib": used / MIB, "heap_free_mib": free / MIB,
                                            "where": self.where}  # fmt: skip

    def on_step_begin(self, info: Any) -> None:
        """Start reading the heap after every operator of the profiled step."""
        self.where = f"step {info.step}"
        if info.step == self.profile_step:
            self.figures["step_hwm_start_mib"] = status_kib("VmHWM") / 1024
            self.mode = HeapWatch()
            self.mode.__enter__()

    def on_step_end(self, info: Any) -> None:
        """Record the profiled step's working set, the tensors after step 1, and the figures so far."""
        self.rank, self.where = info.rank, f"after step {info.step}"
        self.figures["hwm_by_step_mib"].append(status_kib("VmHWM") / 1024)
        if os.environ.get(TRIM_ENV) == "1":  # the --trim-steps arm: glibc hands back what it keeps free
            import time

            from rayft.training.loop.heap import release_free_memory

            started = time.perf_counter()
            release_free_memory()
            self.figures.setdefault("trim_s", []).append(time.perf_counter() - started)
        if info.step == 1:
            self.figures["step1_tensors_mib"] = {k: v / MIB for k, v in reachable_tensors().items()}
        if self.mode is not None and info.step == self.profile_step:
            self.mode.__exit__(None, None, None)
            self.record_step(self.mode)
            self.mode = None
        self.write()

    def record_step(self, watch: Any) -> None:
        """The profiled step's working set, split at the start of its training: what came before (GRPO's
        rollout: sampling, scoring, the training rows) and the training (forward, backward, optimizer)."""
        start = watch.start
        self.figures["step_working_set_mib"] = (watch.peak - start) / MIB
        self.figures["step_heap_start_mib"] = start / MIB
        self.figures["step_hwm_end_mib"] = status_kib("VmHWM") / 1024
        if watch.training is not None:
            self.figures["rollout_working_set_mib"] = (watch.training["peak_before"] - start) / MIB
            self.figures["rollout_left_mib"] = (watch.training["level"] - start) / MIB
            self.figures["training_working_set_mib"] = (watch.training["peak"] - start) / MIB
            self.figures["step_hwm_training_start_mib"] = watch.training["hwm_mib"]

    def on_train_end(self, info: Any) -> None:
        """The last figures: the worker's peak resident set over the whole run."""
        self.stopped.set()
        self.write()

    def write(self) -> None:
        """This rank's figures as JSON (rewritten after every step: the last write wins)."""
        self.figures["peak_rss_mib"] = status_kib("VmHWM") / 1024
        self.figures["pid"] = os.getpid()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank-{self.rank}.json").write_text(json.dumps(self.figures))


def _heap_watch_class() -> type:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _HeapWatch(TorchDispatchMode):  # type: ignore[no-untyped-call] # torch leaves __init_subclass__ unannotated
        """The heap in use, read after every operator: its level at entry, its peak, and its peak before and
        after the step's training begins (the first operator under grad mode with a parameter among its inputs:
        the first forward pass that trains; GRPO samples and scores its completions before it, under no_grad)."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call] # unannotated in torch
            self.start = self.peak = heap()[0]
            self.training: dict[str, float] | None = None  # the heap and VmHWM when training began, its peak since

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if self.training is None and torch.is_grad_enabled() and trains(args, kwargs):
                used = heap()[0]
                self.training = {"peak_before": self.peak, "level": used, "peak": used,
                                 "hwm_mib": status_kib("VmHWM") / 1024}  # fmt: skip
            out = func(*args, **(kwargs or {}))
            used = heap()[0]
            self.peak = max(self.peak, used)
            if self.training is not None:
                self.training["peak"] = max(self.training["peak"], used)
            return out

    def trains(args: Any, kwargs: Any) -> bool:
        return any(isinstance(leaf, torch.nn.Parameter) for leaf in tree_leaves((args, kwargs)))

    return _HeapWatch


def HeapWatch() -> Any:  # noqa: N802 # built on first use: the driver of the benchmark imports no torch
    """A dispatch mode that tracks the heap's peak (see :func:`_heap_watch_class`)."""
    return _heap_watch_class()()


def write_problems(path: Path, count: int) -> None:
    """The first ``count`` GSM8K training problems as JSON lines."""
    path.write_text("".join(line + "\n" for line in GSM8K.read_text().splitlines()[:count]))


# GRPO as configs/gsm8k-grpo.yaml sets it: its prompt and reference templates (the chat template on), LoRA,
# 2 prompts per worker, groups of 8, 4 completions per forward, DAPO's loss, KL off; the math reward alone and
# 48-token completions. A row over 256 tokens is dropped, not cut: cutting would cut the '#### N' answer line
# (about a third of GSM8K's first rows are dropped, each listed in the run's data/rejected.jsonl).
GRPO_PROMPTS = 2
GRPO = [
    "data.overlong=drop", "data.max_rejected_fraction=0.6", "train.method=lora", "lora.r=16", "lora.alpha=32",
    "train.objective=grpo", f"train.micro_batch_size={GRPO_PROMPTS}", "train.learning_rate=5e-5",
    "train.warmup_steps=0",
    "train.rl.group_size=8", "train.rl.max_new_tokens=48", "train.rl.completions_per_forward=4",
    "train.rl.temperature=0.7", "train.rl.loss=dapo", "train.rl.epsilon=0.2", "train.rl.epsilon_high=0.28",
    "train.rl.kl_coef=0", "train.rl.rewards=[{function: math}]",
]  # fmt: skip


def method_overrides(method: str, data: Path) -> tuple[list[str], int]:
    """The dataset and training overrides of ``method`` (lora, full or grpo), and the rows its steps read."""
    # YAML's double quotes: the prompt's line break is a line break (single quotes would keep a backslash and an n).
    prompt = f"data.datasets=[{{path: '{data}', format: template, input_template: \"Question: {{question}}\\nAnswer:\""
    if method == "grpo":
        return [f"{prompt}, output_template: '{{answer}}'}}]", *GRPO], GRPO_PROMPTS
    dataset = f"{prompt}, output_template: ' {{answer}}', use_chat_template: false}}]"
    return [dataset, "data.overlong=truncate", f"train.micro_batch_size={BATCH}", f"train.method={method}"], BATCH


def train_arm(
    method: str, workers: int, steps: int, variant: tuple[list[str], dict[str, str]], work: Path, *, profile_step: int
) -> list[dict[str, Any]]:
    """One training in a fresh process; each worker's figures."""
    data, out = work / "problems.jsonl", work / "memory"
    arm, rows_per_step = method_overrides(method, data)
    # GRPO drops the rows over 256 tokens (a third to a half of GSM8K's first ones): three times the rows.
    write_problems(data, max(workers, 1) * rows_per_step * steps * (3 if method == "grpo" else 1))
    overrides = [
        f"model.name={MODEL}", f"storage_path={work}", "name=mem", f"scaling.num_workers={workers}", *arm,
        "data.packing=false", "data.validation_fraction=0", "data.shuffle_buffer_size=1", f"data.max_seq_length={SEQ}",
        f"data.cache_dir={work / 'cache'}", f"train.max_steps={steps}", "train.eval_steps=null",
        "train.save_steps=100000", "logging.tensorboard=false", "checkpoint.num_to_keep=1",
        f"train.callbacks=[{{target: 'bench_worker_memory:WorkerMemory', "
        f"options: {{out: '{out}', profile_step: {profile_step}}}}}]",
        *variant[0],
    ]  # fmt: skip
    code = "import sys, rayft; from rayft.config import load_config; rayft.api.train(load_config(None, sys.argv[1:]))"
    run_env = {**os.environ, **variant[1], "PYTHONPATH": f"{REPO / 'benchmarks'}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True, text=True, check=False,
                          cwd=REPO, env=run_env)  # fmt: skip
    if done.returncode != 0:
        raise ArmError(f"the {method} arm on {workers} workers failed:\n{done.stderr[-4000:]}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


class ArmError(Exception):
    """A training arm that did not finish (its process's last lines in the message)."""


IMPORTS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench_worker_memory import status_kib
import torch, transformers, peft, ray, ray.train.torch, pyarrow
import rayft.training.loop.entry
print(json.dumps({"rss_mib": status_kib("VmRSS") / 1024}))
"""


def imports_rss() -> float:
    """Resident set of a fresh process that imports what a training worker imports."""
    done = subprocess.run([sys.executable, "-c", IMPORTS, str(REPO / "benchmarks")], capture_output=True, text=True,
                          check=True, cwd=REPO)  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_mib"])


TRL = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_sft_trl as b
b.SEQ = int(sys.argv[3])
args = type("Args", (), {"rows": int(sys.argv[2]), "heldout": 1, "threads": 2})()
print(json.dumps(b.run_arm("trl", args)))
"""


def trl_arm(steps: int) -> dict[str, Any]:
    """TRL's ``SFTTrainer`` on the same LoRA work (``bench_sft_trl.py``'s arm) in a fresh process."""
    done = subprocess.run([sys.executable, "-c", TRL, str(REPO / "benchmarks"), str(BATCH * steps), str(SEQ)],
                          capture_output=True, text=True, check=False, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the TRL arm failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def breakdown(fig: dict[str, Any], imports_mib: float) -> dict[str, float]:
    """A worker's peak split into its parts (MiB)."""
    built, step1 = fig["built_tensors_mib"], fig.get("step1_tensors_mib", fig["built_tensors_mib"])
    parts = {
        "imports": imports_mib,
        "weights (frozen)": built["frozen"],
        "trained params": built["trained"],
        "other tensors after load": built["other"],
        "added by step 1": step1["other"] - built["other"],  # AdamW's moments; DDP's buckets, when Python reaches them
        "step working set": fig.get("step_working_set_mib", float("nan")),
        "allocator kept free": fig["heap_free_at_peak_mib"],
        "Arrow pool": fig["arrow_peak_mib"],
    }
    parts["unexplained"] = fig["peak_rss_mib"] - sum(parts.values())
    return parts


def parse_env(text: str) -> dict[str, str]:
    """``KEY=VALUE,KEY=VALUE`` as a dict."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    return dict(pairs)


def main() -> None:
    """Each arm in a fresh process; a table of each worker's peak and its parts, ratios against "before"."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--methods", default="lora,full", help="of lora, full, grpo")
    parser.add_argument("--profile-step", type=int, default=2, help="the step whose working set is read")
    parser.add_argument("--workers", default="2,1")
    parser.add_argument("--env", default="", help="KEY=VALUE,... for the workers: one more arm")
    parser.add_argument("--trl", action="store_true", help="also TRL's SFTTrainer on the same LoRA work")
    parser.add_argument("--skip-after", action="store_true", help="leave out the 1 MiB threshold's arm")
    parser.add_argument("--skip-jemalloc", action="store_true", help="leave out jemalloc's arm")
    parser.add_argument("--trim-steps", action="store_true", help="one more arm: malloc_trim(0) after each step")
    parser.add_argument("--frozen-fp32", action="store_true",
                        help="one more arm: LoRA's frozen layers in fp32 (train.frozen_precision=fp32)")  # fmt: skip
    args = parser.parse_args()
    unknown = sorted(set(args.methods.split(",")) - {"lora", "full", "grpo"})
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose among lora, full, grpo")
    if not 1 <= args.profile_step <= args.steps:
        parser.error(f"--profile-step {args.profile_step}: choose a step from 1 to --steps ({args.steps})")
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    imports_mib = imports_rss()
    print(f"imports (torch, transformers, peft, ray.train, rayft's loop): {imports_mib:.0f} MiB", flush=True)
    from rayft.training.loop.heap import find_jemalloc

    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        BEFORE: (["train.allocator=glibc", "train.malloc_mmap_threshold_bytes=null"], {}),
        AFTER: (["train.allocator=glibc", "train.malloc_mmap_threshold_bytes=1048576"], {}),
    }
    if args.skip_after:
        del variants[AFTER]
    if find_jemalloc((sys.prefix,)) is not None and not args.skip_jemalloc:
        variants[JEMALLOC] = (["train.allocator=jemalloc"], {})
    if args.trim_steps:
        variants[TRIMMED] = (["train.allocator=glibc", "train.malloc_mmap_threshold_bytes=null"], {TRIM_ENV: "1"})
    if args.frozen_fp32:
        variants[FROZEN_FP32] = (
            ["train.allocator=glibc", "train.malloc_mmap_threshold_bytes=null", "train.frozen_precision=fp32"],
            {},
        )
    if args.env:
        variants[args.env] = (["train.allocator=glibc", "train.malloc_mmap_threshold_bytes=null"], parse_env(args.env))
    rows, failed = run_arms(args, variants, imports_mib)
    if rows:
        print_table(rows)
        print_rss_peaks(rows)
        print_phases(rows)
    if args.trl:
        trl = trl_arm(args.steps)
        print(json.dumps(trl), flush=True)
        for row in rows:
            if row["method"] == "lora" and row["rank"] == 0:
                print(f"LoRA, {row['workers']} worker(s), {row['variant']}: rayft's rank-0 worker peak "
                      f"{row['peak_rss_mib']:.0f} MiB vs TRL's SFTTrainer {trl['peak_mib']:.0f} MiB "
                      f"({row['peak_rss_mib'] / trl['peak_mib']:.2f}x)")  # fmt: skip
        print(f"TRL's phases (MiB): { {k: round(v) for k, v in trl['phase_peaks_mib'].items()} }")
    if failed:
        raise SystemExit(f"{failed} arm(s) failed (above)")


def run_arms(
    args: argparse.Namespace, variants: dict[str, tuple[list[str], dict[str, str]]], imports_mib: float
) -> tuple[list[dict[str, Any]], int]:
    """Every arm, one after the other: each worker's figures (also printed as JSON lines), and the arms that failed
    (each reported on stderr; the others still run)."""
    rows, failed = [], 0
    for method in args.methods.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            for name, variant in variants.items():
                with tempfile.TemporaryDirectory(prefix="bench-worker-memory-") as work:
                    try:
                        figures = train_arm(
                            method, workers, args.steps, variant, Path(work), profile_step=args.profile_step
                        )
                    except ArmError as exc:
                        print(f"{name}: {exc}", file=sys.stderr, flush=True)
                        failed += 1
                        continue
                for rank, fig in enumerate(figures):
                    rows.append({"method": method, "workers": workers, "variant": name, "rank": rank, **fig,
                                 "parts": breakdown(fig, imports_mib)})  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
    return rows, failed


def print_table(rows: list[dict[str, Any]]) -> None:
    """The markdown table: one row per worker, peaks and parts in MiB, ratio of the peak to the "before" arm's."""
    names = list(rows[0]["parts"])
    print("\n| method | workers | variant | rank | peak RSS | vs before | built (peak) | "
          + " | ".join(names) + " |")  # fmt: skip
    print("|" + "---|" * (7 + len(names)))
    for row in rows:
        base = next((r for r in rows if r["method"] == row["method"] and r["workers"] == row["workers"]
                     and r["rank"] == row["rank"] and r["variant"] == BEFORE), None)  # fmt: skip
        ratio = "n/a" if base is None else f"{row['peak_rss_mib'] / base['peak_rss_mib']:.2f}x"  # "before" failed
        glibc = row["variant"] != JEMALLOC
        cells = [f"{row['parts'][n]:.0f}" if glibc or n not in GLIBC_HEAP_PARTS else "n/a" for n in names]
        print(f"| {row['method']} | {row['workers']} | {row['variant']} | {row['rank']} | {row['peak_rss_mib']:.0f} | "
              f"{ratio} | {row['built_hwm_mib']:.0f} | " + " | ".join(cells) + " |")  # fmt: skip


PHASES = {"rollout working set": "rollout_working_set_mib", "rollout left in use": "rollout_left_mib",
          "training working set": "training_working_set_mib", "VmHWM at step start": "step_hwm_start_mib",
          "at training start": "step_hwm_training_start_mib", "at step end": "step_hwm_end_mib"}  # fmt: skip


def print_phases(rows: list[dict[str, Any]]) -> None:
    """The profiled step split at the start of its training (MiB): GRPO's rollout, then its training."""
    phased = [row for row in rows if row["method"] == "grpo"]
    if not phased:
        return
    print("\n| method | workers | variant | rank | " + " | ".join(PHASES) + " |")
    print("|" + "---|" * (4 + len(PHASES)))
    for row in phased:
        glibc = row["variant"] != JEMALLOC
        cells = [f"{row[key]:.0f}" if key in row and (glibc or "hwm" in key) else "n/a" for key in PHASES.values()]
        print(f"| {row['method']} | {row['workers']} | {row['variant']} | {row['rank']} | " + " | ".join(cells) + " |")


def print_rss_peaks(rows: list[dict[str, Any]]) -> None:
    """Each worker's largest sampled resident set (MiB): when it was, and the heap in use and kept free then."""
    print("\n| method | workers | variant | rank | largest sampled RSS | when | heap in use | heap kept free | "
          "not heap | VmHWM after each step |")  # fmt: skip
    print("|" + "---|" * 10)
    for row in rows:
        peak, glibc = row["rss_peak"], row["variant"] != JEMALLOC
        heap_cells = ["n/a"] * 3
        if glibc and "heap_used_mib" in peak:
            rest = peak["rss_mib"] - peak["heap_used_mib"] - peak["heap_free_mib"]
            heap_cells = [f"{peak['heap_used_mib']:.0f}", f"{peak['heap_free_mib']:.0f}", f"{rest:.0f}"]
        steps = ", ".join(f"{v:.0f}" for v in row["hwm_by_step_mib"])
        print(f"| {row['method']} | {row['workers']} | {row['variant']} | {row['rank']} | {peak['rss_mib']:.0f} | "
              f"{peak.get('where', '-')} | " + " | ".join(heap_cells) + f" | {steps} |")  # fmt: skip


if __name__ == "__main__":
    main()
