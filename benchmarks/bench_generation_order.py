"""HF generation with batches formed by prompt length vs in prompt order, on the quickstart eval.

The eval path of ``rayft eval`` in-process with configs/quickstart.yaml's eval section (the
built-in arithmetic test split through SmolLM2-135M-Instruct's chat template, greedy, the gsm8k
task's stop sequences, batch size 16), shortened: ``--prompts`` rows and ``--max-new-tokens``.
Arms: the prompts batched in their order (the code before length sorting) and longest first
(:func:`rayft.evaluation.runner.generate`, now the default). Each arm loads its backend as ``rayft
eval`` does on the local runtime (load time included, the same in both); alternating A B A B after
one warm-up of each; medians with min-max of rows/s.

    .venv/bin/python benchmarks/bench_generation_order.py [--prompts 32] [--max-new-tokens 48] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from rayft.config import load_config
from rayft.config.generation import GenerationConfig
from rayft.evaluation.runner import generation_config, load_examples
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Prompt
from rayft.models.sources import resolve_source

REPO = Path(__file__).resolve().parents[1]


def quickstart_eval(prompts: int, max_new_tokens: int) -> tuple[list[Prompt], GenerationConfig]:
    """The quickstart eval's first ``prompts`` prompts and its generation settings, with
    ``max_new_tokens`` (shared by the generation benchmarks)."""
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [
        f"eval.max_samples={prompts}", f"eval.generation.max_new_tokens={max_new_tokens}",
    ])  # fmt: skip
    task = build_task(cfg.eval)
    items = [e.prompt for e in load_examples(cfg.eval, task).items]
    return items, generation_config(cfg.eval, resolve_source(cfg.model.name, cfg.model), task)


def main() -> None:
    """Measure both arms and print rows/s and their ratio with the command that produced them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from rayft.evaluation import runner

    prompts, gen_cfg = quickstart_eval(args.prompts, args.max_new_tokens)
    arms = {"prompt order": runner._generate_local, "longest first": lambda p, c: runner.generate(p, c, "local")}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    texts: dict[str, list[str]] = {}
    for round_index in range(args.repeats + 1):
        for arm, run in arms.items():
            started = time.perf_counter()
            texts[arm] = [g.text for g in run(prompts, gen_cfg)]
            if round_index > 0:
                rates[arm].append(len(prompts) / (time.perf_counter() - started))
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"quickstart eval: {len(prompts)} prompts, batch {gen_cfg.batch_size}, max_new_tokens {args.max_new_tokens}")
    for arm, values in rates.items():
        print(f"{arm:>14}: {statistics.median(values):.2f} rows/s (min {min(values):.2f}, max {max(values):.2f})")
    before, after = (statistics.median(v) for v in rates.values())
    print(f"ratio longest-first / prompt order: {after / before:.2f}x")
    same = texts["prompt order"] == texts["longest first"]
    print(f"same completions in both arms: {same}")


if __name__ == "__main__":
    main()
