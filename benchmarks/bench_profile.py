"""What profiling costs: tokens/s of rayft's training loop with the step breakdown off, on (the
default), on with every phase synchronised, and on with an idle ``train.profile`` trace window
(one that never opens), on the quickstart model (SmolLM2-135M-Instruct, LoRA r 16), in one process
without Ray.

Every arm trains the same seeded steps on the built-in arithmetic problems (so the same tokens);
arms alternate (A B C D A B C D ...). A step's time is the gap
between the timestamps of consecutive metrics.jsonl lines (``train.logging_steps 1``), so the time
spent gathering and writing the breakdown itself counts; the first steps (start-up) are left out.
Figures: median step time per arm over all its runs, and tokens/s relative to the arm with the
breakdown off ('none') (above 1.0: faster).

    .venv/bin/python benchmarks/bench_profile.py [--steps 16] [--repeats 2] [--micro-batch 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ARMS = {
    "none": ["train.profile.step_timing=none"],
    "host": ["train.profile.step_timing=host"],
    "synced": ["train.profile.step_timing=synced"],
    "idle-trace": [
        "train.profile.step_timing=host",
        "train.profile.wait_steps=1000000",
        "train.profile.active_steps=1",
    ],
}
SKIP_STEPS = 3


def run_arm(root: Path, name: str, overrides: list[str], prepared: object, args: argparse.Namespace) -> list[float]:
    """Train one arm; its steady per-step wall times (s)."""
    from rayft.config import CheckpointConfig, load_config
    from rayft.runs.location import RunLocation
    from rayft.training.driver.launcher import launch_local
    from rayft.training.driver.startup import build_worker_plan, claim_run_dir

    cfg = load_config(None, [
        "model.name=smollm2-135m-instruct", f"storage_path={root}", f"name=arm-{name}", "seed=0",
        f"train.max_steps={args.steps}", f"train.micro_batch_size={args.micro_batch}", "train.logging_steps=1",
        "train.save_steps=1000000", "train.eval_steps=null", "lora.r=16", "lora.alpha=32",
        "logging.tensorboard=false", "logging.console=false", *overrides,
    ])  # fmt: skip
    run_dir = claim_run_dir(cfg, resume=False)
    launch_local(build_worker_plan(cfg, prepared, RunLocation(run_dir)), prepared, CheckpointConfig())  # type: ignore[arg-type]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stamps = [r["time"] for r in records if "train/loss" in r]  # not the final save's line
    return [b - a for a, b in zip(stamps[SKIP_STEPS:], stamps[SKIP_STEPS + 1 :], strict=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer
    from rayft.testing.units import arithmetic_prepared

    arms = args.arms.split(",")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        root = Path(tmp)
        tokenizer = load_tokenizer(ModelConfig(name="smollm2-135m-instruct"))
        prepared = arithmetic_prepared(root / "units", tokenizer, num_train=args.steps * args.micro_batch)
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        started = time.monotonic()
        for repeat in range(args.repeats):
            for arm in arms:
                times[arm].extend(run_arm(root / f"r{repeat}", arm, ARMS[arm], prepared, args))
    report(times, device, time.monotonic() - started, args)


def report(times: dict[str, list[float]], device: str, elapsed_s: float, args: argparse.Namespace) -> None:
    """Print (and write with --json) the median step time per arm and tokens/s relative to 'none'."""
    base = statistics.median(times["none"]) if "none" in times else None
    rows = {}
    print(f"device: {device}; {args.repeats} runs x {args.steps - SKIP_STEPS - 1} steps per arm; {elapsed_s:.0f} s")
    print(f"{'arm':<12} {'median step ms':>15} {'mean step ms':>13} {'tokens/s vs none':>16}")
    for arm, steps in times.items():
        median = statistics.median(steps)
        ratio = base / median if base else float("nan")
        rows[arm] = {"median_step_s": median, "mean_step_s": statistics.fmean(steps), "tokens_per_s_vs_none": ratio}
        print(f"{arm:<12} {1000 * median:>15.1f} {1000 * statistics.fmean(steps):>13.1f} {ratio:>16.4f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": device, "arms": rows}, indent=2))


if __name__ == "__main__":
    main()
