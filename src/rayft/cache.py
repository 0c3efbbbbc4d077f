"""Where rayft caches converted models and tokenized datasets."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache directory: $RAYFT_CACHE, or ~/.cache/rayft."""
    return Path(os.environ.get("RAYFT_CACHE") or Path.home() / ".cache" / "rayft").expanduser()
