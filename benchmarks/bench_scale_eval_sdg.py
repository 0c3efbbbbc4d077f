"""Memory of `rayft eval` and of SDG's dedup index and consolidation as the data grows, each size
measured in the same run, printed with its ratio to the smallest size (and to a baseline checkout).

- ``eval``: `rayft eval` (task exact_match, the tiny random test model in-process, greedy, 2 new
  tokens, batches of 32) on N synthetic prompts of about 280 characters: the driver's peak RSS and
  its process tree's peak (sampled 10 times a second, as ``bench_scale.py`` does), and rows/s.
- ``eval-driver``: what the eval process holds of the examples, without a model: N rows read, each
  answered by a fixed text (no generation), scored (exact_match), and its predictions written, in a
  fresh process, the peak of ``tracemalloc`` (MiB): through :mod:`rayft.evaluation.streaming` here, and
  through ``load_examples`` + ``score_run`` + ``prediction_rows`` in a checkout without it.
- ``dedup``: the SDG row filters (exact and near dedup at the defaults) fed N distinct synthetic
  questions in a fresh process: bytes traced by ``tracemalloc`` per accepted row.
- ``consolidate``: N rows committed as parts of 512 rows, then consolidated in a fresh process:
  how much its peak RSS grows while it consolidates (MiB).

    .venv/bin/python benchmarks/bench_scale_eval_sdg.py eval --rows 1000 10000 --baseline /tmp/rayft-main
    .venv/bin/python benchmarks/bench_scale_eval_sdg.py dedup --rows 2000 8000 32000 --baseline /tmp/rayft-main
    .venv/bin/python benchmarks/bench_scale_eval_sdg.py consolidate --rows 20000 80000 320000 --baseline ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import REPO, measure, write_rows

DEDUP = """
import json, random, sys, tracemalloc
from rayft.config.sdg import SdgDecontaminationConfig, SdgDedupConfig
from rayft.sdg.filters import RowFilters
from rayft.sdg.rows import ROW_DEFAULTS
rows = int(sys.argv[1])
rng = random.Random(rows)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(5000)]
questions = [" ".join(rng.choice(words) for _ in range(40)) + f" {i}?" for i in range(rows)]
tracemalloc.start()
filters = RowFilters(SdgDedupConfig(), SdgDecontaminationConfig())
before = tracemalloc.get_traced_memory()[0]
accepted = 0
for i, q in enumerate(questions):
    row = {**ROW_DEFAULTS, "question": q, "seed_id": f"seed-{i // 4}", "answer": "1"}
    filters.apply([row])
    accepted += not row["reject_reason"]
print(json.dumps([accepted, (tracemalloc.get_traced_memory()[0] - before) / accepted]))
"""

CONSOLIDATE = """
import json, sys
from pathlib import Path
from rayft.sdg.store import SdgStore
def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
store = SdgStore(Path(sys.argv[1]))
store.done_records()
import pyarrow, pyarrow.parquet  # imported by both versions: part of the base
base = peak_kib()
counts = store.consolidate()
print(json.dumps([counts[0], (peak_kib() - base) / 1024]))
"""

EVAL_DRIVER = """
import json, sys, tracemalloc
from pathlib import Path
from rayft.config.data import DatasetConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource
ev = EvalConfig(task="exact_match", datasets=[DatasetConfig(path=sys.argv[1])], num_fewshot=0, bootstrap_samples=200,
                max_samples=None)
task, source, out = build_task(ev), ResolvedSource("m", "model", ModelConfig(name="org/m")), Path(sys.argv[2])
tracemalloc.start()
try:
    from rayft.evaluation import streaming
except ImportError:
    streaming = None
if streaming is not None:
    from rayft.evaluation.report import example_record
    from rayft.evaluation.runner import ScoreTally, open_examples
    from rayft.generation.pool import in_input_order
    class Echo:  # answers every prompt with a fixed text, a batch at a time
        def map(self, batches):
            for tag, prompts in batches:
                yield tag, [Generation("the answer", 3, 1) for _ in prompts]
    examples, tally = open_examples(ev, task), ScoreTally(task)
    with (out / "rows.jsonl").open("w") as rows:
        for window in in_input_order(examples, lambda e: e.prompt, Echo(), batch_size=32):
            items, gens = [e for e, _ in window], [g for _, g in window]
            for item in zip(items, gens, tally.add(items, gens)):
                rows.write(json.dumps(example_record(*item)) + "\\n")
    run = tally.finish("m", source, ev, 1.0)
    import dataclasses
    streaming.write_predictions(out / "predictions.jsonl", dataclasses.replace(run, rows_path=out / "rows.jsonl"))
else:
    from rayft.evaluation.report import prediction_rows, write_jsonl
    from rayft.evaluation.runner import load_examples, score_run
    examples = load_examples(ev, task)
    gens = [Generation("the answer", 3, 1) for _ in examples.items]
    run = score_run("m", source, examples, gens, task=task, ev=ev, elapsed_s=1.0)
    write_jsonl(out / "predictions.jsonl", prediction_rows(run, examples))
print(json.dumps([run.metrics["exact_match"].n, tracemalloc.get_traced_memory()[1] / 2**20]))
"""

MAKE_PARTS = """
import sys
from pathlib import Path
from rayft.sdg.rows import ROW_DEFAULTS
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import part_record
store = SdgStore(Path(sys.argv[1]))
store.open("bench")
rows, per_part = int(sys.argv[2]), 512
for part, start in enumerate(range(0, rows, per_part), start=1):
    batch = [{**ROW_DEFAULTS, "id": f"r{i}", "seed_id": f"s{i}", "question": f"Question {i}: " + "x" * 200,
              "answer": f"Answer {i}: " + "y" * 60} for i in range(start, min(rows, start + per_part))]
    store.commit_part(part, batch, [], part_record(batch, [r["seed_id"] for r in batch], {}))
"""


def run_python(checkout: Path, code: str, *args: str) -> str:
    """Run ``code`` in a fresh Python with ``checkout``'s rayft first on the path; its last line."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed in {checkout}:\n{done.stderr[-3000:]}")
    return (done.stdout.strip().splitlines() or [""])[-1]


def eval_config(directory: Path, model: Path, data: Path) -> Path:
    """An eval config over ``data``: exact match, in-process, 2 greedy new tokens."""
    path = directory / "eval.yaml"
    path.write_text(
        f"name: scale\nstorage_path: {directory / 'runs'}\nmodel:\n  name: {model}\n"
        f"eval:\n  datasets:\n    - path: {data}\n  task: exact_match\n  runtime: local\n  batch_size: 32\n"
        "  num_fewshot: 0\n  max_samples: null\n  bootstrap_samples: 200\n"
        "  generation:\n    max_new_tokens: 2\n    temperature: 0\n"
    )
    return path


def table(title: str, head: list[str], rows: list[tuple[str, int, list[float]]]) -> None:
    """A Markdown table: each value with its ratio to the same checkout's smallest size."""
    print(f"\n{title}\n\n| checkout | rows | " + " | ".join(head) + " |")
    print("|---|---|" + "---|" * len(head))
    first: dict[str, list[float]] = {}
    for label, size, values in rows:
        base = first.setdefault(label, values)
        cells = [f"{v:,.1f} ({v / b:.2f}x)" if b else f"{v:,.1f}" for v, b in zip(values, base, strict=True)]
        print(f"| {label} | {size:,} | " + " | ".join(cells) + " |")


def main() -> None:
    """Measure every size for every checkout, then print one table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["eval", "eval-driver", "dedup", "consolidate"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--baseline", type=Path, help="another rayft checkout to measure the same way")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    checkouts = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    results: list[tuple[str, int, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        if args.what == "eval":
            from rayft.testing import build_tiny_model

            model = build_tiny_model(Path(tmp) / "model")
        for rows in args.rows:
            for label, checkout in checkouts:
                run_dir = Path(tmp) / f"{label}-{rows}"
                run_dir.mkdir()
                if args.what == "eval":
                    data = Path(tmp) / f"rows-{rows}.jsonl"
                    if not data.exists():
                        write_rows(data, rows)
                    command = ["eval", str(eval_config(run_dir, model, data)), "--model", str(model),
                               "--output", str(run_dir / "report")]  # fmt: skip
                    m = measure(checkout, label, command, rows)
                    results.append((label, rows, [m.driver_peak_mib, m.tree_peak_mib, m.rows_per_s]))
                elif args.what == "eval-driver":
                    data = Path(tmp) / f"rows-{rows}.jsonl"
                    if not data.exists():
                        write_rows(data, rows)
                    scored, peak = run_python(checkout, EVAL_DRIVER, str(data), str(run_dir)).strip("[]").split(",")
                    results.append((label, int(scored), [float(peak)]))
                elif args.what == "dedup":
                    accepted, per_row = run_python(checkout, DEDUP, str(rows)).strip("[]").split(",")
                    results.append((label, rows, [float(accepted), float(per_row)]))
                else:
                    run_python(REPO, MAKE_PARTS, str(run_dir / "sdg"), str(rows))
                    written, grew = run_python(checkout, CONSOLIDATE, str(run_dir / "sdg")).strip("[]").split(",")
                    results.append((label, int(written), [float(grew)]))
                print(f"{label} {rows}: {results[-1][2]}", flush=True)
    heads = {
        "eval": ["driver peak (MiB)", "process tree peak (MiB)", "rows/s"],
        "eval-driver": ["traced peak (MiB)"],
        "dedup": ["accepted rows", "dedup bytes per accepted row"],
        "consolidate": ["consolidation peak RSS growth (MiB)"],
    }
    table(f"{args.what} (ratio to the smallest size of the same checkout)", heads[args.what], results)


if __name__ == "__main__":
    main()
