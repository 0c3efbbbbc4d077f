"""Weak scaling of DDP on gloo: 1 worker x 1 thread vs 2 workers x 1 thread.

rayft's per-worker loop under torchrun (the same loop Ray Train runs, without Ray's start-up), a
random-initialised decoder (the ``large`` size of :mod:`bench_overhead`: 384 hidden, 6 layers,
8 x 256 tokens per worker per step) on seeded token data. Each worker's batch is the same in both
arms, so 2 workers do twice the work per step. Throughput is tokens per step (all workers) over the
median gap between consecutive steps' log times (warm-up and the final save left out). Arms
alternate A B A B after one warm-up round. Efficiency = tokens/s(2) / (2 x tokens/s(1)); target >= 0.9.

    .venv/bin/python benchmarks/bench_ddp_scaling.py [--steps 12] [--repeats 2]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import SIZES, build_inputs

REPO = Path(__file__).resolve().parents[1]


def write_plan(root: Path, model_dir: Path, prepared_dir: Path, *, workers: int, steps: int, run_dir: Path) -> Path:
    """The worker plan of one arm, as JSON."""
    from rayft.config import load_config
    from rayft.data.prepared import PreparedData
    from rayft.runs.location import RunLocation
    from rayft.training.driver.launcher import split_files
    from rayft.training.driver.startup import build_worker_plan
    from rayft.training.driver.torchrun import write_plan as write_json

    micro = SIZES["large"][3]
    cfg = load_config(None, [
        f"model.name={model_dir}", "train.method=full", f"train.micro_batch_size={micro}", f"train.max_steps={steps}",
        "train.eval_steps=null", f"train.save_steps={steps}", "logging.tensorboard=false", "logging.console=false",
        f"scaling.num_workers={workers}", "train.learning_rate=1e-4",
    ])  # fmt: skip
    prepared = PreparedData.load(prepared_dir)
    assert prepared is not None
    path = root / f"plan-{run_dir.name}.json"
    write_json(path, build_worker_plan(cfg, prepared, RunLocation(run_dir)), split_files(prepared))
    return path


def run_arm(workers: int, plan: Path, run_dir: Path) -> float:
    """Tokens/s of one run of ``workers`` single-threaded torchrun workers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", str(workers), "-m",
               "rayft.training.driver.torchrun", str(plan)]  # fmt: skip
    done = subprocess.run(command, env=env, check=False, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {workers}-worker arm failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in records if "train/loss" in r]
    gap = statistics.median(b - a for a, b in itertools.pairwise(times[2:-1]))
    _, _, _, micro, seq = SIZES["large"]
    return workers * micro * seq / gap


def main() -> None:
    """Alternate 1 and 2 workers and print the efficiency with the command that produced it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    with tempfile.TemporaryDirectory(prefix="rayft-bench-ddp-") as tmp:
        root = Path(tmp)
        model_dir, prepared_dir = build_inputs(root, "large", args.steps)
        results: dict[int, list[float]] = {1: [], 2: []}
        for round_index in range(args.repeats + 1):
            for workers in (1, 2):
                run_dir = root / f"run-{workers}-{round_index}"
                plan = write_plan(root, model_dir, prepared_dir, workers=workers, steps=args.steps, run_dir=run_dir)
                tokens_per_s = run_arm(workers, plan, run_dir)
                print(f"  round {round_index}: {workers} worker(s) {tokens_per_s:.0f} tokens/s", flush=True)
                if round_index > 0:
                    results[workers].append(tokens_per_s)
    efficiency = [two / (2 * one) for one, two in zip(results[1], results[2], strict=True)]
    print(f"machine: {os.cpu_count()} CPUs, load average over 1/5/15 min {os.getloadavg()} (other processes "
          "compete with the 2-worker arm for the same cores)")  # fmt: skip
    print(f"tokens/s 1 worker: {[round(v) for v in results[1]]}, 2 workers: {[round(v) for v in results[2]]}")
    print(f"weak-scaling efficiency tokens/s(2) / (2 x tokens/s(1)): {statistics.median(efficiency):.2f} "
          f"({min(efficiency):.2f}-{max(efficiency):.2f}); target >= 0.9")  # fmt: skip


if __name__ == "__main__":
    main()
