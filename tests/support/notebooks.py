"""Where the example notebooks live (shared by the notebook tests)."""

from __future__ import annotations

from pathlib import Path

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "examples" / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
