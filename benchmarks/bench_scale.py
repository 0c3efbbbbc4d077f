"""Memory and speed of `rayft data prepare` and `rayft generate` as the data grows: the driver's peak
RSS, the peak of its whole process tree (Ray's head processes and workers included, PSS where the
kernel gives it) and rows/s, at each size, for this checkout and optionally a baseline checkout, all
in one run.

The data: synthetic rows of about 280 characters. `data prepare` (the default ``--command``): rows
in `format: template`, packed, tokenized by the tiny test tokenizer on Ray Data with the machine's
CPUs, into a fresh cache each time. `generate`: one prompt per row (``Question: ...``), answered
greedily with 4 new tokens by the tiny random test model on one Ray actor, batches of 32. Sizes and
checkouts alternate, so a slow minute of a shared machine does not land on one side only. A baseline
is any checkout of rayft (its ``src`` goes first on PYTHONPATH), e.g. of the main branch's HEAD:

    mkdir /tmp/rayft-main && git -C <repo> archive HEAD | tar -x -C /tmp/rayft-main
    .venv/bin/python benchmarks/bench_scale.py --rows 10000 100000 --baseline /tmp/rayft-main
    .venv/bin/python benchmarks/bench_scale.py --rows 10000 1000000 --baseline /tmp/rayft-main --baseline-rows 160000
    .venv/bin/python benchmarks/bench_scale.py --command generate --rows 1000 10000 --baseline /tmp/rayft-main

``--read-only`` measures reading the rows alone (how much a fresh process's peak RSS grows in
``read_sources``), without Ray or the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "an",
    "be",
    "this",
    "from",
    "or",
    "have",
    "not",
    "are",
]


@dataclass(frozen=True)
class Measure:
    """One command's run: its peaks (MiB), wall time and rows per second."""

    checkout: str
    rows: int
    driver_peak_mib: float
    tree_peak_mib: float
    wall_s: float

    @property
    def rows_per_s(self) -> float:
        """Rows prepared (or prompts answered) per second of the whole command (start-up included)."""
        return self.rows / self.wall_s


def write_rows(path: Path, rows: int) -> None:
    """``rows`` JSON Lines rows of about 280 characters, the same for the same count."""
    rng = random.Random(rows)
    with path.open("w", encoding="utf-8") as file:
        for i in range(rows):
            question = " ".join(rng.choice(WORDS) for _ in range(30))
            answer = " ".join(rng.choice(WORDS) for _ in range(22))
            file.write(json.dumps({"id": i, "question": question, "answer": answer}) + "\n")


def write_prompts(path: Path, rows: int) -> None:
    """``rows`` prompts of about 280 characters for `rayft generate`, the same for the same count."""
    rng = random.Random(rows)
    with path.open("w", encoding="utf-8") as file:
        for i in range(rows):
            question = " ".join(rng.choice(WORDS) for _ in range(52))
            file.write(json.dumps({"id": i, "prompt": f"Question: {question}"}) + "\n")


def generate_args(directory: Path, model: Path, data: Path) -> list[str]:
    """The `rayft generate` command line of one measure."""
    return ["generate", str(model), "--input", str(data), "--output", str(directory / "out.jsonl"),
            "--temperature", "0", "--max-new-tokens", "4", "--batch-size", "32", "--num-workers", "1"]  # fmt: skip


def write_config(directory: Path, model: Path, data: Path) -> Path:
    """A preparation config for ``data`` with its own cache directory."""
    path = directory / "prepare.yaml"
    path.write_text(
        f"name: scale\nstorage_path: {directory / 'runs'}\nmodel:\n  name: {model}\n"
        f"data:\n  datasets:\n    - path: {data}\n      format: template\n"
        "      input_template: 'Question: {question}'\n      output_template: ' {answer}'\n"
        f"  packing: true\n  max_seq_length: 512\n  validation_fraction: 0.01\n  cache_dir: {directory / 'cache'}\n"
    )
    return path


def _tree_mib(process: object) -> tuple[float, float]:
    """(the process's RSS, the sum of its tree's PSS, else RSS), in MiB."""
    import psutil

    assert isinstance(process, psutil.Process)
    driver = process.memory_info().rss
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            info = member.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return driver / 2**20, total / 2**20


def measure(checkout: Path, label: str, command: list[str], rows: int) -> Measure:
    """Run `rayft COMMAND...` from ``checkout``, sampling its memory 10 times a second."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "RAY_DEDUP_LOGS": "0"}
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "rayft", *command], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    peaks = [0.0, 0.0]
    done = threading.Event()

    def sample() -> None:
        process = psutil.Process(child.pid)
        while not done.is_set():
            try:
                driver, tree = _tree_mib(process)
            except psutil.NoSuchProcess:
                return
            peaks[0], peaks[1] = max(peaks[0], driver), max(peaks[1], tree)
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = child.communicate()
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"{label} at {rows} rows failed ({child.returncode}):\n{output[-3000:]}")
    return Measure(label, rows, peaks[0], peaks[1], wall)


READ_ONLY = """
import json, sys
from rayft.config import load_config
cfg = load_config(None, [f"data.datasets=[{{path: '{sys.argv[1]}', format: template, "
                         f"input_template: 'Q: {{question}}', output_template: ' {{answer}}'}}]"])
import pyarrow  # both readers use it: its import belongs to the base
try:
    from rayft.data.read.rows import read_sources
except ImportError:  # a checkout from before the read subpackage
    try:
        from rayft.data.reader import read_sources
    except ImportError:  # a checkout from before the row-by-row reader
        from rayft.data.sources import read_sources
def peak_kib():  # this process's own high-water mark (ru_maxrss would start from the parent's at fork)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
base = peak_kib()
read_sources(cfg.data)
print(json.dumps((peak_kib() - base) / 1024))
"""


def measure_read(checkout: Path, data: Path) -> float:
    """How much the peak RSS of a fresh process grows while it reads ``data`` for preparation (MiB)."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    done = subprocess.run([sys.executable, "-c", READ_ONLY, str(data)], env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return float(done.stdout.split()[-1])


def main() -> None:
    """Measure every size for every checkout, then print one table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", choices=["prepare", "generate"], default="prepare", help="what to measure")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--baseline", type=Path, help="another rayft checkout to measure the same way")
    parser.add_argument("--baseline-rows", type=int, nargs="+",
                        help="sizes to measure the baseline at, instead of --rows")  # fmt: skip
    parser.add_argument("--read-only", action="store_true", help="measure only reading the rows (no Ray, no CLI)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from rayft.testing import build_tiny_model

    checkouts = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    sizes = {"this": set(args.rows), "baseline": set(args.baseline_rows or args.rows)}
    results: list[Measure] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        for rows in sorted(sizes["this"] | (sizes["baseline"] if args.baseline else set())):
            data = Path(tmp) / f"rows-{rows}.jsonl"
            (write_prompts if args.command == "generate" else write_rows)(data, rows)
            for label, checkout in checkouts:
                if rows not in sizes[label]:
                    continue
                if args.read_only:
                    print(f"| {label} | {rows:,} | read: peak RSS +{measure_read(checkout, data):,.1f} MiB |")
                    continue
                run_dir = Path(tmp) / f"{label}-{rows}"
                run_dir.mkdir()
                if args.command == "generate":
                    command = generate_args(run_dir, model, data)
                else:
                    command = ["data", "prepare", str(write_config(run_dir, model, data))]
                results.append(measure(checkout, label, command, rows))
                print(f"{label} {rows}: done in {results[-1].wall_s:.1f} s", flush=True)
    if args.read_only:
        return
    print(f"\nrayft {'generate' if args.command == 'generate' else 'data prepare'}")
    print("\n| checkout | rows | driver peak (MiB) | process tree peak (MiB) | wall (s) | rows/s |")
    print("|---|---|---|---|---|---|")
    for m in results:
        print(f"| {m.checkout} | {m.rows:,} | {m.driver_peak_mib:,.0f} | {m.tree_peak_mib:,.0f} | {m.wall_s:.1f} "
              f"| {m.rows_per_s:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
