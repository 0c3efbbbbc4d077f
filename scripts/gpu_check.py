"""One command on a GPU machine: the ``gpu`` test tier, then the training-step benchmark, one table.

Runs without Ray and without network (torch, transformers, peft, pydantic, PyYAML, pyarrow and
pytest are enough; bitsandbytes for the QLoRA cases, which skip without it): ``pytest -m gpu
tests/gpu`` and ``benchmarks/bench_gpu_step.py`` as child processes of this one, with the
repository's ``src`` on the path, then prints every test's outcome and the benchmark's table
together. Exit status 0 only when every test passed or was skipped.

    make gpu-check                      # or: python scripts/gpu_check.py
    python scripts/gpu_check.py --bench-args "--arch qwen2.5-1.5b --methods lora --steps 5"
    python scripts/gpu_check.py --skip-bench
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDED = ("torch", "transformers", "peft", "pydantic", "yaml", "pyarrow", "pytest")


def missing_packages() -> list[str]:
    """The packages the check needs that do not import here."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def run_tests(junit: Path, extra_env: dict[str, str]) -> int:
    """The gpu tier; warnings are reported, not turned into failures (the CPU tiers' strictness
    would fail a GPU check on a library's deprecation notice)."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider",
               "-W", "default", f"--junitxml={junit}"]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=extra_env, check=False).returncode


def test_rows(junit: Path) -> list[tuple[str, str, float]]:
    """(test, outcome, seconds) of every test in the JUnit report."""
    if not junit.exists():
        return []
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "FAILED"
            elif child.tag == "skipped":
                outcome = f"skipped ({(child.get('message') or '')[:60]})"
        rows.append((case.get("name", "?"), outcome, float(case.get("time", 0.0))))
    return rows


def run_bench(out: Path, bench_args: str, extra_env: dict[str, str]) -> list[dict[str, object]]:
    """The training-step benchmark's results (empty when it failed)."""
    command = [sys.executable, "benchmarks/bench_gpu_step.py", *shlex.split(bench_args), "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, env=extra_env, check=False)
    if done.returncode != 0 or not out.exists():
        print(f"bench_gpu_step.py failed (exit {done.returncode})")
        return []
    results: list[dict[str, object]] = json.loads(out.read_text())
    return results


def main() -> int:
    """Check, test, benchmark, print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-args", default="", help="arguments for bench_gpu_step.py")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    missing = missing_packages()
    if missing:
        print(f"gpu-check needs {', '.join(missing)}: pip install {' '.join(missing)} (PyYAML for yaml)")
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="rayft-gpu-check-") as tmp:
        status = run_tests(Path(tmp) / "junit.xml", env)
        rows = test_rows(Path(tmp) / "junit.xml")
        results = [] if args.skip_bench else run_bench(Path(tmp) / "bench.json", args.bench_args, env)
    print("\n== rayft gpu-check ==")
    width = max((len(name) for name, _, _ in rows), default=10)
    for name, outcome, seconds in rows:
        print(f"{name:<{width}}  {seconds:7.1f} s  {outcome}")
    if results:
        sys.path.insert(0, str(REPO / "benchmarks"))
        sys.path.insert(0, str(REPO / "src"))
        from bench_gpu_step import Result, table

        print()
        print(table([Result(**r) for r in results]))  # type: ignore[arg-type]
    failed = status not in (0, 5) or any(outcome == "FAILED" for _, outcome, _ in rows)
    print(f"\ngpu tier: {'FAILED' if failed else 'ok'} ({len(rows)} tests)")
    return 1 if failed or (not args.skip_bench and not results) else 0


if __name__ == "__main__":
    sys.exit(main())
