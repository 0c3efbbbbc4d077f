"""lineage.json: which artifact came from which inputs, with hashes and the software versions."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
import time
from pathlib import Path
from typing import Any

from rayft.runs.records import StageRecord

PACKAGES = ("rayft", "ray", "torch", "transformers", "peft", "datasets", "pyarrow", "safetensors")


def software_versions() -> dict[str, str]:
    """Versions of Python and of the packages that decide a run's result (``absent`` when missing)."""
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def build_lineage(name: str, records: list[StageRecord], config_hash: str) -> dict[str, Any]:
    """The lineage document of a pipeline run: one entry per stage, in order."""
    return {
        "run": name,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config_sha256": config_hash,
        "software": software_versions(),
        "stages": [
            {
                "stage": r.stage,
                "fingerprint": r.fingerprint,
                "inputs": r.inputs,
                "outputs": r.outputs,
                "elapsed_s": round(r.elapsed_s, 2),
            }
            for r in records
        ],
    }


def relative(run_dir: Path, path: Path) -> str:
    """A path relative to the run directory when inside it, else absolute."""
    try:
        return path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())
