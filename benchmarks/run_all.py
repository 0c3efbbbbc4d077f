"""Run every benchmark under benchmarks/ with its default settings, one after another.

Each benchmark prints its own ratios against the baseline it measures in the same run; this
script only runs them in turn and reports which ones failed. Pass names to run a subset:
``python benchmarks/run_all.py bench_packing bench_eval``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def main(names: list[str]) -> int:
    """Run the chosen benchmarks (all when none are named); the exit status counts the failures."""
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem in names]
        unknown = sorted(set(names) - {s.stem for s in scripts})
        if unknown:
            available = ", ".join(s.stem for s in sorted(here.glob("bench_*.py")))
            print(f"unknown benchmarks: {', '.join(unknown)}; available: {available}")
            return 2
    failed = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        started = time.monotonic()
        code = subprocess.call([sys.executable, str(script)])
        print(f"=== {script.stem}: exit {code} after {time.monotonic() - started:.0f} s ===", flush=True)
        if code:
            failed.append(script.stem)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return len(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
