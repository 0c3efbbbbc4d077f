"""Packing efficiency of preparation's windows against packing the whole split at once, on the same
examples: the synthetic rows of `bench_scale.py` (about 280 characters, `format: template`,
`max_seq_length` 512, the tiny test tokenizer), tokenized in this process, then packed first-fit
decreasing once over every training example and once within each window of
:func:`rayft.data.windows.plan_windows`. Efficiency is tokens / (units x max_seq_length).

    .venv/bin/python benchmarks/bench_packing_windows.py --rows 10000 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPACITY = 512


def train_lengths(rows: int, tmp: Path) -> list[int]:
    """The token counts of the kept training examples of ``rows`` synthetic rows, in sample order."""
    from bench_scale import write_rows
    from rayft.config import load_config
    from rayft.data.read.rows import read_sources
    from rayft.data.split_plan import plan_examples
    from rayft.data.tokenize import TextTokenizer, TokenizeJob
    from rayft.models.loading import load_tokenizer
    from rayft.testing import build_tiny_model

    data = tmp / f"rows-{rows}.jsonl"
    write_rows(data, rows)
    cfg = load_config(None, [f"model.name={build_tiny_model(tmp / 'model')}", f"data.max_seq_length={CAPACITY}",
                             f"data.datasets=[{{path: '{data}', format: template, "
                             "input_template: 'Question: {question}', output_template: ' {answer}'}]",
                             "data.validation_fraction=0.01"])  # fmt: skip
    sources = read_sources(cfg.data)
    plan = plan_examples([len(sources[0].rows)], [1.0], train_sources=1, validation_fraction=0.01, seed=cfg.seed)
    job = TokenizeJob(TextTokenizer.from_hf(load_tokenizer(cfg.model)), ((sources[0].config, sources[0].format),),
                      CAPACITY, "truncate", False)  # fmt: skip
    texts = sources[0].rows
    lengths: list[int] = []
    for start in range(0, plan.num_train, 1024):
        rows_ = plan.rows[start : min(start + 1024, plan.num_train)].tolist()
        out = job({"sample_id": list(range(len(rows_))), "dataset": [0] * len(rows_), "row": [texts[r] for r in rows_]})
        lengths += [len(ids) for ids, reason in zip(out["input_ids"], out["reason"], strict=True) if not reason]
    return lengths


def efficiency(lengths: list[int], windows: list[tuple[int, int]]) -> tuple[int, float]:
    """(units, efficiency) of packing each ``[start, stop)`` of ``lengths`` on its own."""
    from rayft.data.packing import plan_packs

    units = sum(len(plan_packs(lengths[a:b], CAPACITY)) for a, b in windows)
    return units, sum(lengths) / (units * CAPACITY)


def main() -> None:
    """Print one row per size: global and windowed units and efficiency."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "src"), str(REPO / "benchmarks")]
    from rayft.data.windows import plan_windows

    print("| rows | examples | windows | units: whole split | units: windows | efficiency: whole | windows |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
            lengths = train_lengths(rows, Path(tmp))
        windows = [(w.start, min(w.stop, len(lengths))) for w in plan_windows(len(lengths), len(lengths))]
        whole, windowed = efficiency(lengths, [(0, len(lengths))]), efficiency(lengths, windows)
        print(f"| {rows:,} | {len(lengths):,} | {len(windows)} | {whole[0]:,} | {windowed[0]:,} | {whole[1]:.4f} "
              f"| {windowed[1]:.4f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
