"""Preprocessing throughput: rayft's tokenization on Ray Data (one task per block of rows, 2 CPUs) vs a
single-process `datasets.map`, and the time of a cached re-run.

Both arms run the identical per-batch function (render with the chat template, tokenize with
offsets, label, truncate) on GSM8K train with the SmolLM2 tokenizer, so the only difference is the
execution engine; their outputs are checked equal. The Ray arm includes shipping the job and the
rows to the tasks (paid by every preparation) but not `ray.init` (paid once per command, and by
training anyway); Ray runs with the settings `rayft data prepare` starts it with. Arms alternate A B A B after
one warm-up of each (the warm-up's first-use times are printed too); medians with min-max.

    .venv/bin/python benchmarks/bench_preprocess.py [--copies 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k" / "train.jsonl"
MODEL = "smollm2-135m-instruct"


def build_job(copies: int) -> tuple[object, object]:
    """The tokenize job and its input table, exactly as `prepare` builds them, GSM8K repeated ``copies`` times."""
    import pyarrow as pa

    from rayft.config import load_config
    from rayft.data.read.rows import read_sources
    from rayft.data.split_plan import plan_records
    from rayft.data.tokenize import TextTokenizer, TokenizeJob
    from rayft.models.loading import load_tokenizer

    cfg = load_config(None, [f"model.name={MODEL}", f"data.datasets=[{{path: '{GSM8K}'}}]"])
    sources = read_sources(cfg.data)
    records = plan_records([len(sources[0].rows)], [1.0], train_sources=1, validation_fraction=0.0, seed=0)
    rows = [sources[0].rows[r.row] for r in records] * copies
    inputs = pa.table({"sample_id": list(range(len(rows))), "dataset": [0] * len(rows), "row": rows})
    job = TokenizeJob(
        TextTokenizer.from_hf(load_tokenizer(cfg.model)),
        ((sources[0].config, sources[0].format),),
        1024,
        "truncate",
        False,
    )
    return job, inputs


def run_datasets_map(job: object, inputs: object) -> tuple[float, object]:
    """Single-process baseline: `datasets.Dataset.map(batched=True)` in memory."""
    import datasets

    datasets.disable_progress_bars()
    started = time.perf_counter()
    dataset = datasets.Dataset(datasets.table.InMemoryTable(inputs))
    out = dataset.map(job, batched=True, batch_size=256, keep_in_memory=True, load_from_cache_file=False,
                      remove_columns=["dataset", "row"])  # fmt: skip
    table = out.data.table
    return time.perf_counter() - started, table


def run_ray(job: object, inputs: object) -> tuple[float, object]:
    """The rayft path: `tokenize_on_ray`, a Ray Data `map_batches` task per block of rows, 1 CPU each."""
    from rayft.data.executors import tokenize_on_ray

    started = time.perf_counter()
    table = tokenize_on_ray(job, inputs)  # type: ignore[arg-type]
    return time.perf_counter() - started, table


def cached_rerun() -> tuple[float, float]:
    """(seconds of `prepare` on a warm cache in this process, wall seconds of the `rayft data prepare` CLI)."""
    from rayft.config import load_config
    from rayft.data.prepare import prepare

    cfg = load_config(None, [f"model.name={MODEL}", f"data.datasets=[{{path: '{GSM8K}'}}]"])
    first = prepare(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False)
    started = time.perf_counter()
    again = prepare(cfg.data, cfg.model, cfg.seed, report_dir=None, use_ray=False)
    in_process = time.perf_counter() - started
    assert again.reused and again.prepared.key == first.prepared.key
    config = Path(os.environ["RAYFT_DATA_CACHE"]) / "bench.yaml"
    config.write_text(f"model:\n  name: {MODEL}\ndata:\n  datasets:\n    - path: {GSM8K}\n")
    started = time.perf_counter()
    cli = subprocess.run(
        [sys.executable, "-m", "rayft", "data", "prepare", str(config), "--in-process",
         "--report-dir", str(config.parent / "report")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    assert "reused the cached dataset" in cli.stdout, cli.stdout
    return in_process, wall


def _burn(n: int) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(n):
        total += i * i
    return time.perf_counter() - started


def parallel_ceiling(repeats: int, n: int = 10_000_000) -> list[float]:
    """The speed-up of two processes over one on pure-Python work, measured now on this machine:
    the most any 2-worker engine can gain over a 1-thread baseline here (2 vCPUs rarely give 2x)."""
    import multiprocessing

    ratios = []
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_burn, [1000, 1000])  # start the workers
        for _ in range(repeats):
            one = _burn(n)
            started = time.perf_counter()
            pool.map(_burn, [n, n])
            ratios.append(2 * one / (time.perf_counter() - started))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=2, help="GSM8K train repeated this many times")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per arm (after one warm-up)")
    parser.add_argument(
        "--single-thread-baseline",
        action="store_true",
        help="TOKENIZERS_PARALLELISM=false for the baseline too (by default its Rust tokenizer uses every core)",
    )
    args = parser.parse_args()
    if args.single_thread_baseline:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"

    import ray

    from rayft._ray_private import local_init_kwargs

    cache = Path(tempfile.mkdtemp(prefix="rayft-bench-preprocess-"))
    os.environ["RAYFT_DATA_CACHE"] = str(cache)
    job, inputs = build_job(args.copies)
    rows = inputs.num_rows  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {"datasets.map": [], "ray": []}
    first_use: dict[str, float] = {}
    outputs = {}
    # Ray with the settings of the local Ray that `rayft data prepare` starts, on 2 CPUs.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, **local_init_kwargs(os.environ))
    try:
        for trial in range(args.repeats + 1):
            for name, arm in (("datasets.map", run_datasets_map), ("ray", run_ray)):
                seconds, table = arm(job, inputs)
                outputs[name] = table
                if trial > 0:
                    times[name].append(seconds)
                else:
                    first_use[name] = seconds
                print(f"  trial {trial} {name}: {seconds:.2f} s ({rows / seconds:.0f} rows/s)", flush=True)
    finally:
        ray.shutdown()
    base, ray_table = outputs["datasets.map"].sort_by("sample_id"), outputs["ray"].sort_by("sample_id")
    same = all(base.column(c).to_pylist() == ray_table.column(c).to_pylist() for c in ("input_ids", "labels"))
    in_process, cli_wall = cached_rerun()
    ceiling = parallel_ceiling(args.repeats + 2)
    shutil.rmtree(cache, ignore_errors=True)

    rate = {name: [rows / t for t in ts] for name, ts in times.items()}
    print(f"\nGSM8K train x{args.copies} = {rows} rows, SmolLM2 tokenizer, chat template, max_seq_length 1024")
    for name in times:
        med = statistics.median(rate[name])
        print(f"  {name:13s} {med:8.0f} rows/s (min {min(rate[name]):.0f}, max {max(rate[name]):.0f})")
    ratios = [r / b for r, b in zip(rate["ray"], rate["datasets.map"], strict=True)]
    print(f"  Ray Data / datasets.map: {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})"
          f"  [target >= 1.7x]; outputs identical: {same}")  # fmt: skip
    print(f"  first use (the warm-up, not in the medians): datasets.map {first_use['datasets.map']:.2f} s, "
          f"Ray {first_use['ray']:.2f} s (workers import rayft and receive the tokenizer)")  # fmt: skip
    print(f"  cached re-run: prepare() {in_process:.2f} s in a warm process; `rayft data prepare` CLI {cli_wall:.2f} s "
          "wall (Python start and imports included)  [target < 2 s]")  # fmt: skip
    print(f"  this machine's 2-process ceiling (pure Python, 2 processes vs 1): {statistics.median(ceiling):.2f}x "
          f"(min {min(ceiling):.2f}, max {max(ceiling):.2f}); the Ray ratio reaches "
          f"{statistics.median(ratios) / statistics.median(ceiling):.0%} of it")  # fmt: skip
    tokenizer_threads = "1 thread" if args.single_thread_baseline else "Rust tokenizer on every core"
    print(f"  baseline: one process, {tokenizer_threads}; Ray: 2 tasks of 1 CPU, 1 tokenizer thread each")
    print(f"  load: {os.getloadavg()}")
    flag = " --single-thread-baseline" if args.single_thread_baseline else ""
    command = f"benchmarks/bench_preprocess.py --copies {args.copies} --repeats {args.repeats}{flag}"
    print(f"  command: .venv/bin/python {command}")


if __name__ == "__main__":
    main()
