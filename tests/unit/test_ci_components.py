"""Under CI=true a test skipped for a missing CI component (Chromium, Prometheus, moto, Optuna...)
fails; elsewhere it skips with the install line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing_ci_component

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import pytest

@pytest.mark.skipif(True, reason="needs Debian's chromium: apt-get install -y chromium")
def test_browser():
    pass

def test_optuna():
    pytest.importorskip("optuna_is_not_installed", reason="needs the tune extra: pip install 'rayft[tune]'")

@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_gpu():
    pass
"""


def test_skip_reasons_name_the_component() -> None:
    assert missing_ci_component("needs Debian's prometheus: apt-get install -y prometheus") == "prometheus"
    assert missing_ci_component("needs moto[server] (the dev extra)") == "moto"
    assert missing_ci_component("needs a CUDA GPU") is None


# A skipif skip fails in setup (an error), an importorskip in the call (a failure): both fail the run.
@pytest.mark.parametrize(("ci", "expected"), [("true", "1 failed, 1 skipped, 1 error"), ("", "3 skipped")])
def test_missing_components_fail_only_under_ci(tmp_path: Path, ci: str, expected: str) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    # The probe runs under this repository's conftest (its hook), from a rootdir-less copy.
    conftest = (REPO / "tests" / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(conftest)
    env = {"PATH": "/usr/bin:/bin", "CI": ci, "PYTHONPATH": f"{REPO}{':' + str(REPO / 'src')}"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert expected in done.stdout, done.stdout + done.stderr
    if ci:
        assert "CI=true and a test component is missing (chromium)" in done.stdout
