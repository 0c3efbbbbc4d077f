"""What a sweep costs and what early stopping saves, on the tiny model with Ray Train workers.

(a) Overhead: the same trials (a grid of learning rates, one at a time: tune.max_concurrent_trials=1)
    run as one ``rayft tune`` sweep (FIFO) and one by one with ``rayft train``.
    Both arms pay what a user pays: ``rayft train`` starts a local Ray per run, the sweep one Ray in all.
    Reported: wall seconds of each arm, their ratio, and the sweep's cost per trial over a plain run.
(b) Early stopping: the same grid under ASHA against FIFO; the wall time each needs, the best metric
    each finds (ASHA must find FIFO's), the trials ASHA stopped early, and the speed-up.

Arms run in the order train / fifo / asha, repeated; medians with min-max are quoted (one repeat by
default: each arm is minutes on two CPUs).

    .venv/bin/python benchmarks/bench_tune.py [--repeats 1] [--steps 8] [--rates 3e-3,0.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def base_overrides(root: Path, model: Path, steps: int) -> list[str]:
    """One trial's training: tiny model, one Ray Train worker, an evaluation every two steps."""
    return [f"storage_path={root / 'runs'}", f"model.name={model}", "scaling.num_workers=1", "lora.r=4",
            f"train.max_steps={steps}", "train.eval_steps=2", "train.save_steps=2", "train.micro_batch_size=2",
            "data.datasets=[{path: 'builtin:arithmetic', max_rows: 200}]", "data.validation_fraction=0.1",
            "data.max_seq_length=320", "logging.tensorboard=false", "logging.console=false"]  # fmt: skip


def rayft(args: list[str], root: Path, what: str) -> float:
    """Run one rayft command; its wall seconds."""
    env = {**os.environ, "RAYFT_CACHE": str(root / "cache"), "PYTHONPATH": str(REPO / "src")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rayft", *args], check=False, cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return time.monotonic() - started


def one_by_one(root: Path, config: Path, common: list[str], rates: list[float], tag: str) -> float:
    """Every learning rate as its own ``rayft train`` run, one after the other."""
    return sum(
        rayft(["train", str(config), *common, f"name={tag}-{i}", f"train.learning_rate={lr}"], root, f"train lr={lr}")
        for i, lr in enumerate(rates)
    )


def sweep(root: Path, config: Path, common: list[str], scheduler: str, tag: str) -> tuple[float, object]:
    """One ``rayft tune`` sweep; its wall seconds and its result (tune.json)."""
    from rayft.tuning.results import load_sweep_result

    name = f"{tag}-{scheduler}"
    seconds = rayft(["tune", str(config), *common, f"name={name}", f"tune.scheduler={scheduler}"], root, name)
    found = sorted((root / "runs").rglob("tune.json"))
    result = next(load_sweep_result(p) for p in found if p.parent.name == f"{name}-tune")
    return seconds, result


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rates", default="3e-3,0.5", help="the learning-rate grid, best first")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from rayft.testing import build_tiny_model

    rates = [float(r) for r in args.rates.split(",")]
    grid = "{" + "train.learning_rate: {grid: [" + ", ".join(str(r) for r in rates) + "]}}"
    times: dict[str, list[float]] = {"train": [], "fifo": [], "asha": []}
    best: dict[str, list[float]] = {"fifo": [], "asha": []}
    stopped: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model")
        config = root / "sweep.yaml"
        config.write_text("tune:\n  metric: eval/loss\n  mode: min\n  search_algorithm: grid\n")
        common = [*base_overrides(root, model, args.steps), f"tune.search_space={grid}", "tune.grace_period=1",
                  "tune.reduction_factor=2", "tune.seed=0", "tune.max_concurrent_trials=1"]  # fmt: skip
        for i in range(args.repeats):
            times["train"].append(one_by_one(root, config, common, rates, f"seq{i}"))
            for scheduler in ("fifo", "asha"):
                seconds, result = sweep(root, config, common, scheduler, f"r{i}")
                times[scheduler].append(seconds)
                metric = result.best.metric if result.best else float("nan")  # type: ignore[attr-defined]
                best[scheduler].append(metric)
                if scheduler == "asha":
                    stopped.append(sum(t.status == "STOPPED_EARLY" for t in result.trials))  # type: ignore[attr-defined]
    train_s, fifo_s, asha_s = (statistics.median(times[k]) for k in ("train", "fifo", "asha"))
    n = len(rates)
    print(f"tiny model, 1 Ray Train worker per trial, {args.steps} steps, eval every 2, grid of {n} learning rates "
          f"{rates}, {args.repeats} repeat(s), medians (min-max)")  # fmt: skip
    print(f"(a) one by one with rayft train: {spread(times['train'])}   one rayft tune sweep (fifo): "
          f"{spread(times['fifo'])}   ratio sweep/one-by-one {fifo_s / train_s:.3f}   "
          f"({(fifo_s - train_s) / n:+.1f} s per trial)")  # fmt: skip
    print(f"(b) fifo {spread(times['fifo'])} best eval/loss {best['fifo']}   asha {spread(times['asha'])} "
          f"best eval/loss {best['asha']}   trials stopped early by asha {stopped}   "
          f"speed-up asha over fifo {fifo_s / asha_s:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
