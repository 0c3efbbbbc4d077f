"""``tracking.json`` in a run directory: the tracker run ids a restart or ``--resume`` continues."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rayft.files import replacing
from rayft.runs.layout import TRACKING_FILE, TRACKING_UNSENT_FILE

UNSENT_FILE = TRACKING_UNSENT_FILE
__all__ = ["TRACKING_FILE", "UNSENT_FILE", "read_ids", "write_ids"]


def read_ids(run_dir: Path) -> dict[str, Any]:
    """The recorded ids (``{"mlflow": {...}, "wandb": {...}}``), empty when none were recorded."""
    path = run_dir / TRACKING_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def write_ids(run_dir: Path, tracker: str, ids: dict[str, Any]) -> None:
    """Record ``ids`` for ``tracker`` (atomically, keeping the other trackers' entries)."""
    data = read_ids(run_dir)
    data[tracker] = ids
    with replacing(run_dir / TRACKING_FILE) as handle:
        handle.write(json.dumps(data, indent=2, sort_keys=True))
