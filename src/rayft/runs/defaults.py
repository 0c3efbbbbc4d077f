"""What a command uses when it is not told: the model it scores and the directory its report goes to,
both under the config's run directory. The CLI and the Python API read them here, each wording the
error for a URI ``storage_path`` (which has no local run directory) its own way.
"""

from __future__ import annotations

from pathlib import Path

from rayft.config import RayftConfig
from rayft.runs.location import local_run_dir


def default_model(cfg: RayftConfig, *, command: str, fix: str) -> str:
    """The model a command scores when none is named: the config's run directory if it exists,
    else ``model.name``. ``command`` and ``fix`` word the error for a URI storage_path."""
    run_dir = local_run_dir(cfg.storage_path, cfg.name, command=command, fix=fix)
    return str(run_dir) if run_dir.is_dir() else cfg.model.name


def default_report_dir(cfg: RayftConfig, kind: str, *, command: str, fix: str) -> Path:
    """Where a report of ``kind`` (``eval``, ``compare``, ``data``) goes when no directory is named:
    ``<storage_path>/<name>/<kind>``. ``command`` and ``fix`` word the error for a URI storage_path."""
    return local_run_dir(cfg.storage_path, cfg.name, command=command, fix=fix) / kind
