"""Framework overhead: the identical per-worker loop under torchrun vs on Ray Train.

Both arms run 2 workers with 1 CPU thread each (gloo), a random-init decoder on seeded token
data, the same shard plan and the same seed, so their per-step losses must be identical. Two
model sizes: ~1 s steps (steady-state tokens/s ratio) and ~10 ms steps (fixed per-step overhead).
Runs alternate A B A B after one warm-up run of each arm.

Start-up is the time from launch to the end of step 1 (the first time a step is logged) and,
less one steady step, to its start. Step times are medians of the gaps between consecutive steps
(steady state). The mean over every step after the first is printed beside them: it also holds
what runs beside the first steps (on Ray, the Ray Data actors a worker's first read starts), which
the median leaves out once a run is long enough. The small model runs 2,000 steps (about 20 s)
for that reason.

    .venv/bin/python benchmarks/bench_overhead.py [--repeats 2] [--steps-large 12] [--steps-small 2000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SIZES = {
    # name: (hidden, layers, heads, micro_batch_size, seq_len)
    "large": (384, 6, 6, 8, 256),
    "small": (32, 2, 4, 2, 32),
}

RAY_DRIVER = """
import sys, time, json
from pathlib import Path
from rayft.config import CheckpointConfig, FailureConfig, ScalingConfig
from rayft.data.prepared import PreparedData
from rayft.training.driver.launcher import launch_ray
from rayft.runtime import ray_runtime
from rayft.training.driver.torchrun import read_plan
plan, files = read_plan(Path(sys.argv[1]))
prepared = PreparedData.load(Path(sys.argv[2]))
with ray_runtime():  # the local Ray that `rayft train` starts (2 CPUs on this machine)
    launch_ray(plan, prepared, ScalingConfig(num_workers=2), FailureConfig(max_failures=0),
               CheckpointConfig(num_to_keep=1))
"""


@dataclass
class Arm:
    """One measured run."""

    name: str
    startup_s: float
    step_ms: float
    mean_step_ms: float
    tokens_per_s: float
    losses: dict[int, float]


def build_inputs(root: Path, size: str, steps: int) -> tuple[Path, Path]:
    """A tiny model of ``size`` and seeded random token units: (model dir, prepared dir)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rayft.testing import build_tiny_tokenizer
    from rayft.testing.units import write_prepared

    hidden, layers, heads, micro, seq = SIZES[size]
    model_dir = root / f"model-{size}"
    build_tiny_tokenizer(model_dir)
    config = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=seq * 2,
                         tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    generator = torch.Generator().manual_seed(1)
    units = []
    for index in range(2 * micro * steps):
        ids = torch.randint(10, 500, (seq,), generator=generator).tolist()
        units.append({"input_ids": ids, "labels": ids, "position_ids": list(range(seq)), "sample_ids": [index],
                      "num_tokens": seq, "num_label_tokens": seq - 1})  # fmt: skip
    prepared_dir = root / f"units-{size}"
    write_prepared(prepared_dir, units, max_seq_length=seq)
    return model_dir, prepared_dir


def write_arm_plan(root: Path, model_dir: Path, prepared_dir: Path, *, size: str, steps: int, run_dir: Path) -> Path:
    """The worker plan both arms run, as JSON."""
    from rayft.config import load_config
    from rayft.data.prepared import PreparedData
    from rayft.runs.location import RunLocation
    from rayft.training.driver.launcher import split_files
    from rayft.training.driver.startup import build_worker_plan
    from rayft.training.driver.torchrun import write_plan

    micro = SIZES[size][3]
    cfg = load_config(None, [
        f"model.name={model_dir}", "train.method=full", f"train.micro_batch_size={micro}", f"train.max_steps={steps}",
        "train.eval_steps=null", f"train.save_steps={steps}", "logging.tensorboard=false", "logging.console=false",
        "scaling.num_workers=2", "train.learning_rate=1e-4",
    ])  # fmt: skip
    prepared = PreparedData.load(prepared_dir)
    assert prepared is not None
    plan = build_worker_plan(cfg, prepared, RunLocation(run_dir))
    path = root / f"plan-{run_dir.name}.json"
    write_plan(path, plan, split_files(prepared))
    return path


def run_arm(arm: str, plan: Path, prepared_dir: Path, run_dir: Path) -> Arm:
    """Run one arm in a fresh process tree and read what it logged."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if arm == "torchrun":
        command = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "-m",
                   "rayft.training.driver.torchrun", str(plan)]  # fmt: skip
    else:
        command = [sys.executable, "-c", RAY_DRIVER, str(plan), str(prepared_dir)]
    started = time.time()
    done = subprocess.run(command, env=env, check=False, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {arm} arm failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    times = [r["time"] for r in steps]
    gaps = [b - a for a, b in itertools.pairwise(times[2:-1])]  # skip warm-up and the final save
    return Arm(
        name=arm,
        startup_s=times[0] - started,
        step_ms=1000 * statistics.median(gaps),
        mean_step_ms=1000 * (times[-2] - times[0]) / (len(times) - 2),
        tokens_per_s=statistics.median(r["train/tokens_per_s"] for r in steps[2:-1]),
        losses={r["step"]: r["train/loss"] for r in steps},
    )


def measure(size: str, steps: int, repeats: int, root: Path) -> dict[str, list[Arm]]:
    """Warm up each arm once, then alternate A B for ``repeats`` rounds."""
    model_dir, prepared_dir = build_inputs(root, size, steps)
    results: dict[str, list[Arm]] = {"torchrun": [], "ray": []}
    for round_index in range(repeats + 1):
        for arm in ("torchrun", "ray"):
            run_dir = root / f"run-{size}-{arm}-{round_index}"
            plan = write_arm_plan(root, model_dir, prepared_dir, size=size, steps=steps, run_dir=run_dir)
            result = run_arm(arm, plan, prepared_dir, run_dir)
            if round_index > 0:
                results[arm].append(result)
            print(f"  {size} {arm} round {round_index}: start-up {result.startup_s:.1f} s, "
                  f"step {result.step_ms:.1f} ms, {result.tokens_per_s:.0f} tok/s", flush=True)  # fmt: skip
    return results


def summary(values: list[float]) -> str:
    """Median with min-max."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def report(size: str, results: dict[str, list[Arm]]) -> None:
    """Print ratios of Ray against torchrun."""
    torchrun, ray = results["torchrun"], results["ray"]
    ratio = [r.tokens_per_s / t.tokens_per_s for r, t in zip(ray, torchrun, strict=True)]
    overhead = [r.step_ms - t.step_ms for r, t in zip(ray, torchrun, strict=True)]
    same = all(r.losses == torchrun[0].losses for r in ray)
    print(f"[{size}] tokens/s ray/torchrun: {summary(ratio)}")
    print(f"[{size}] step time ms: torchrun {summary([t.step_ms for t in torchrun])}, "
          f"ray {summary([r.step_ms for r in ray])}")  # fmt: skip
    print(f"[{size}] per-step overhead ms (ray - torchrun): {summary(overhead)}")
    mean_overhead = [r.mean_step_ms - t.mean_step_ms for r, t in zip(ray, torchrun, strict=True)]
    print(f"[{size}] per-step overhead ms, mean over all steps after the first: {summary(mean_overhead)}")
    print(f"[{size}] start-up s, launch to the end of step 1: torchrun {summary([t.startup_s for t in torchrun])}, "
          f"ray {summary([r.startup_s for r in ray])}")  # fmt: skip
    before = {arm: [a.startup_s - a.step_ms / 1000 for a in arms] for arm, arms in results.items()}
    print(f"[{size}] start-up s, launch to the start of step 1 (the above less one steady step): "
          f"torchrun {summary(before['torchrun'])}, ray {summary(before['ray'])}")  # fmt: skip
    print(f"[{size}] per-step losses identical in both arms: {same}")


def main() -> None:
    """Run both sizes and print the figures with the command that produced them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps-large", type=int, default=12)
    parser.add_argument("--steps-small", type=int, default=2000)
    parser.add_argument("--sizes", default="large,small")
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    with tempfile.TemporaryDirectory(prefix="rayft-bench-overhead-") as tmp:
        for size in args.sizes.split(","):
            steps = args.steps_large if size == "large" else args.steps_small
            report(size, measure(size, steps, args.repeats, Path(tmp)))


if __name__ == "__main__":
    main()
