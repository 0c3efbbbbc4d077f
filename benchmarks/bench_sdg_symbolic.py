"""Symbolic SDG throughput: verified GSM8K variations per second, one process vs Ray Data on 2 CPUs.

Seeds are the first --seeds problems of GSM8K train (../shared/datasets/gsm8k/train.jsonl when
present, else builtin:arithmetic). Arm A (baseline) runs the generator and the verifier in this
process; arm B runs the same two stages as lazy Ray Data tasks on a local Ray with 2 CPUs (start-up
excluded, warmed up once); arm C is the whole `rayft sdg` recipe (stages + dedup + decontamination
+ part files + consolidation) on that Ray. Runs alternate A B C, A B C; medians with min-max.

    .venv/bin/python benchmarks/bench_sdg_symbolic.py [--seeds 2000] [--variations 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"


def seeds_config(num_seeds: int, variations: int, out: Path) -> list[str]:
    seeds = [f"sdg.seeds.path={GSM8K}"] if GSM8K.exists() else ["sdg.seeds.path=builtin:arithmetic"]
    return [*seeds, f"sdg.num_seeds={num_seeds}", f"sdg.variations={variations}", f"sdg.output_dir={out}"]


def arm_in_process(seeds: list[dict[str, str]], variations: int) -> tuple[int, float]:
    """Baseline: generate and verify in one Python process."""
    from rayft.config import load_config
    from rayft.sdg.plan import plan_stages

    stages = plan_stages(load_config(None, [f"sdg.variations={variations}"]).sdg, 42, "bench")
    started = time.perf_counter()
    rows = [dict(s) for s in seeds]
    for stage in stages:
        assert stage.fn is not None
        rows = stage.fn(rows)
    elapsed = time.perf_counter() - started
    return sum(1 for r in rows if not r["reject_reason"]), elapsed


def arm_ray_data(seeds: list[dict[str, str]], variations: int, seeds_per_batch: int) -> tuple[int, float]:
    """The same stages as Ray Data tasks on the local 2-CPU Ray."""
    from rayft.config import load_config
    from rayft.sdg.plan import plan_stages
    from rayft.sdg.runner import build_dataset

    sdg = load_config(None, [f"sdg.variations={variations}", f"sdg.seeds_per_batch={seeds_per_batch}"]).sdg
    started = time.perf_counter()
    ds = build_dataset(seeds, plan_stages(sdg, 42, "bench"), sdg)
    verified = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        verified += sum(1 for reason in batch.column("reject_reason").to_pylist() if not reason)
    return verified, time.perf_counter() - started


def arm_recipe(num_seeds: int, variations: int, seeds_per_batch: int) -> tuple[int, float]:
    """The whole recipe, into a fresh output directory."""
    from rayft.config import load_config
    from rayft.recipes.sdg import run

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*seeds_config(num_seeds, variations, Path(tmp)), f"sdg.seeds_per_batch={seeds_per_batch}"]
        started = time.perf_counter()
        result = run(load_config(None, overrides))
        elapsed = time.perf_counter() - started
    # Verified rows before dedup: the recipe's throughput is judged on what its checks passed.
    verified = next(s["rows_out"] for s in result.summary["stages"] if s["stage"] == "quality")
    return verified, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--variations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds-per-batch", type=int, default=64)
    args = parser.parse_args()

    import logging

    import ray

    from rayft.config import load_config
    from rayft.sdg.seeds import read_seeds

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    seeds = read_seeds(load_config(None, seeds_config(args.seeds, args.variations, Path("/unused"))).sdg)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False
    arm_ray_data(seeds[:200], args.variations, args.seeds_per_batch)  # warm-up: worker start-up
    arm_recipe(min(200, args.seeds), args.variations, args.seeds_per_batch)

    rates: dict[str, list[float]] = {"in_process": [], "ray_data_2cpu": [], "recipe_2cpu": []}
    for _ in range(args.repeats):
        n, s = arm_in_process(seeds, args.variations)
        rates["in_process"].append(n / s)
        n, s = arm_ray_data(seeds, args.variations, args.seeds_per_batch)
        rates["ray_data_2cpu"].append(n / s)
        n, s = arm_recipe(args.seeds, args.variations, args.seeds_per_batch)
        rates["recipe_2cpu"].append(n / s)
    ray.shutdown()

    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"seeds: {len(seeds)} from {'GSM8K train' if GSM8K.exists() else 'builtin:arithmetic'}, K={args.variations}")
    base = statistics.median(rates["in_process"])
    for name, values in rates.items():
        med = statistics.median(values)
        print(
            f"{name:<15} verified rows/s median {med:8.0f} (min {min(values):.0f}, max {max(values):.0f})"
            f"   ratio vs in_process {med / base:5.2f}x"
        )


if __name__ == "__main__":
    main()
