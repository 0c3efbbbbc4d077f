"""Run the numerical tests (marker ``numerics``) once under each CPU kernel path PyTorch can be told to take.

    .venv/bin/python scripts/test_kernels.py                  # every variant, then a table of counts
    .venv/bin/python scripts/test_kernels.py -- -n 2 -x       # arguments after -- go to pytest
    .venv/bin/python scripts/test_kernels.py --only avx2-cpu portable    # CI: two runs, each library off native

A bound that holds for one CPU's kernels only (one vector width, one BLAS blocking, one bf16 product
instruction) fails here, on the machine where the test is written, not on a user's. Each variant sets
environment variables the libraries read at start:

- ``ATEN_CPU_CAPABILITY``: which vectorised build of PyTorch's own kernels runs (softmax, reductions,
  elementwise ops, its fallback bf16 products): ``avx512``, ``avx2`` or ``default`` (no explicit vectors).
- ``MKL_CBWR=COMPATIBLE``: MKL's float32 products (every float32 ``linear``/``matmul`` on CPU) on its
  SSE2 code branch: other blocking, other order of the sums.
- ``ONEDNN_MAX_CPU_ISA``: the instructions oneDNN, which runs bf16 products, may use: ``AVX512_CORE_BF16``
  (the bf16 dot-product instruction, not AMX), ``AVX512_CORE`` (bf16 widened to float32 in the kernel) or
  ``AVX2`` (oneDNN then leaves bf16 products to PyTorch's own kernel).

Before a variant runs, a probe in a fresh interpreter reads what the settings did: the capability PyTorch
reports, MKL's code branch (``MKL_VERBOSE``) and the kernel oneDNN picked for a bf16 product
(``ONEDNN_VERBOSE``). A variant that lands on the kernels of one already run (a cap above what the CPU has:
``avx512`` on an AVX2 machine, ``AVX512_CORE_BF16`` where there is no AMX) is not run again and says so.
Exit status 1 when a test failed under any variant.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (name, environment): the native kernels first, then one knob at a time.
VARIANTS: list[tuple[str, dict[str, str]]] = [
    ("native", {}),
    ("aten-avx512", {"ATEN_CPU_CAPABILITY": "avx512"}),
    ("aten-avx2", {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("aten-default", {"ATEN_CPU_CAPABILITY": "default"}),
    ("mkl-compatible", {"MKL_CBWR": "COMPATIBLE"}),
    ("onednn-avx512-bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
    ("onednn-avx512-core", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
    ("onednn-avx2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    # The knobs of the three libraries together, two runs that take each library off its native path (CI's):
    # as an AVX2-only CPU runs (ATen at AVX2, bf16 products in PyTorch's own kernel), and the most portable
    # paths (ATen without explicit vectors, MKL's SSE2 branch, oneDNN's bf16 products without bf16 instructions).
    ("avx2-cpu", {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ("portable", {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
]

# The unit tier's numerical tests (the integration tiers start Ray: their comparisons are too slow to repeat).
MARKERS = "numerics and not integration and not chaos and not slow and not gpu"

# A float32 and a bf16 product, each library saying which code it ran.
_PROBE = """
import torch
a = torch.randn(64, 64)
a @ a
with torch.autocast("cpu", dtype=torch.bfloat16):
    torch.nn.functional.linear(a, a)
print("capability:" + torch.backends.cpu.get_cpu_capability())
"""


def probe(env: dict[str, str]) -> tuple[str, str, str]:
    """(PyTorch's CPU capability, MKL's code branch, oneDNN's bf16 product kernel) under ``env``."""
    verbose = {"MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], env=os.environ | env | verbose, capture_output=True, text=True, check=True
    )
    out = run.stdout + run.stderr
    capability = re.search(r"capability:(\w+)", out)
    branch = re.search(r"CNR:(\w+)", out)
    kernel = re.search(r"primitive,exec,cpu,matmul,([^,]+),", out)
    return (
        capability.group(1) if capability else "?",
        branch.group(1) if branch else "?",
        kernel.group(1) if kernel else "pytorch's own",  # oneDNN declined the bf16 product
    )


def run_variant(env: dict[str, str], pytest_args: list[str]) -> tuple[dict[str, int], float]:
    """The numerical tests under ``env``: counts of passed, failed, skipped, and the seconds taken."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        start = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "pytest", "-m", MARKERS, "-p", "no:randomly", "-q", f"--junitxml={report}",
             *pytest_args],
            env=os.environ | env, cwd=REPO, check=False,
        )  # fmt: skip
        seconds = time.monotonic() - start
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        if report.exists():
            for suite in ET.parse(report).getroot().iter("testsuite"):
                tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
                failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
                counts["passed"] += tests - skipped - failed
                counts["failed"] += failed
                counts["skipped"] += skipped
        else:
            counts["failed"] = 1  # pytest ended before writing its report: a collection or usage error
        return counts, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="run these variants alone (names as in the table)")
    parser.add_argument("--skip", nargs="*", default=[], help="leave these variants out")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()
    rows: list[str] = []
    seen: dict[tuple[str, str, str], str] = {}
    failed = False
    for name, env in VARIANTS:
        if (args.only and name not in args.only) or name in args.skip:
            rows.append(f"{name:<20} {' '.join(f'{k}={v}' for k, v in env.items()) or '(none)'} left out")
            continue
        kernels = probe(env)
        settings = " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"
        found = f"aten={kernels[0]} mkl={kernels[1]} bf16-matmul={kernels[2]}"
        if kernels in seen:
            rows.append(f"{name:<20} {settings} -> {found}: same kernels as {seen[kernels]}, not run")
            continue
        seen[kernels] = name
        print(f"\n== {name}: {settings} -> {found}", flush=True)
        counts, seconds = run_variant(env, args.pytest_args)
        failed |= counts["failed"] > 0
        tally = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped in {seconds:.0f} s"
        rows.append(f"{name:<20} {settings} -> {found}: {tally}")
    print("\nnumerical tests per CPU kernel variant:")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
