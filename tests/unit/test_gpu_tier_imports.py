"""The GPU machine has no Ray: the gpu tier, its benchmark and the check script import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

NO_RAY = """
import sys
sys.modules["ray"] = None  # any import of ray fails
sys.path[:0] = ["benchmarks", "scripts"]
import bench_gpu_step, gpu_check
import pytest
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu"])
print("ray imported:", any(m == "ray" or m.startswith("ray.") for m in sys.modules if sys.modules[m] is not None))
sys.exit(int(code))
"""


def test_gpu_tier_benchmark_and_check_import_without_ray() -> None:
    done = subprocess.run([sys.executable, "-c", NO_RAY], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_memory_estimate_is_within_20_percent_of_the_measured_peak" in done.stdout
    assert "ray imported: False" in done.stdout
