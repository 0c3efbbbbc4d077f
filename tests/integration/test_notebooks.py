"""The example notebooks run, in order, each in a fresh kernel, at the tiny size: none rots unnoticed.

They share one working directory, as a user running them one after the other does: 01 writes the
synthetic data that 02 trains on, 03 evaluates 02's run and 04 serves it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.notebooks import NOTEBOOKS, NOTEBOOKS_DIR

pytestmark = pytest.mark.integration

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

CELL_TIMEOUT_S = 300
SERVING = "04_serving.ipynb"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working directory the four notebooks share."""
    return tmp_path_factory.mktemp("notebooks")


def execute(name: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """Run every cell of the notebook NAME in a new kernel started in its folder; a cell's error fails."""
    # The kernel inherits this environment: the tiny size, the shared directory, and a Ray of its own.
    monkeypatch.setenv("RAYFT_NOTEBOOKS_SIZE", "tiny")
    monkeypatch.setenv("RAYFT_NOTEBOOKS_DIR", str(workdir))
    monkeypatch.setenv("RAY_ADDRESS", "")
    notebook = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}
    )
    client.execute()
    return notebook


def stdout_of(notebook: object) -> str:
    """Everything the notebook's cells printed."""
    cells = notebook.cells  # type: ignore[attr-defined]
    return "".join(o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs)


def images_of(notebook: object) -> int:
    """How many images (plots saved inline as PNG) the notebook's cells show."""
    cells = notebook.cells  # type: ignore[attr-defined]
    return sum("image/png" in o.get("data", {}) for c in cells if c.cell_type == "code" for o in c.outputs)


# An informational line in Ray Serve's format (``INFO 2026-01-31 12:00:00,123 proxy ... -- Proxy starting``).
SERVE_INFO = re.compile(r"\bINFO \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")


def assert_clean(notebook: object) -> None:
    """No progress bar, widget warning or Ray Serve progress line among the cells' outputs: what a person
    reads is the results."""
    cells = notebook.cells  # type: ignore[attr-defined]
    errors = "".join(o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs
                     if o.get("name") == "stderr")  # fmt: skip
    for clutter in ("it/s]", "IProgress not found", "ipywidgets"):
        assert clutter not in errors, errors[:2000]
    assert not SERVE_INFO.search(errors + stdout_of(notebook)), (errors + stdout_of(notebook))[:2000]


def test_the_notebooks_are_the_four_phases() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_synthetic_data.ipynb",
        "02_training.ipynb",
        "03_evaluation.ipynb",
        SERVING,
    ]


def test_01_synthetic_data(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = execute("01_synthetic_data.ipynb", workdir, monkeypatch)
    out = stdout_of(notebook)
    assert_clean(notebook)
    sdg = workdir / "pipeline" / "sdg"
    rows = (sdg / "data.jsonl").read_text().splitlines()
    assert len(rows) > 0
    assert f"{len(rows)} rows accepted" in out
    assert json.loads(rows[0])["generator"] == "symbolic"
    assert "acceptance rate:" in out


def test_02_training(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = execute("02_training.ipynb", workdir, monkeypatch)
    out = stdout_of(notebook)
    assert images_of(notebook) == 1  # loss and learning rate from metrics.jsonl
    assert_clean(notebook)
    run = workdir / "pipeline"
    assert (run / "final" / "rayft_checkpoint.json").is_file()
    assert "4 steps in" in out
    assert f"merged -> {workdir / 'export'}" in out
    assert (workdir / "export" / "config.json").is_file()


def test_03_evaluation(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = execute("03_evaluation.ipynb", workdir, monkeypatch)
    out = stdout_of(notebook)
    assert images_of(notebook) == 1  # the difference with its interval
    assert_clean(notebook)
    compared = json.loads((workdir / "pipeline" / "compare" / "compare.json").read_text())
    assert "base" in json.dumps(compared) and "tuned" in json.dumps(compared)
    assert (workdir / "pipeline" / "eval" / "eval.json").is_file()
    assert f"report: {workdir / 'pipeline' / 'compare' / 'compare.html'}" in out
    assert "--- base:" in out and "--- tuned:" in out


def test_04_serving(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    notebook = execute(SERVING, workdir, monkeypatch)
    out = stdout_of(notebook)
    assert "http://127.0.0.1:" in out
    assert out.count("--- ") == 2  # one answer from the base model, one from the fine-tuned adapter
    assert images_of(notebook) == 1  # the latency of the requests it made
    assert_clean(notebook)
    medians = re.findall(r"^(\S+): median ([\d.]+) s per request, ([\d.]+) tokens/s over 4 requests$", out, re.M)
    assert len(medians) == 2 and all(float(seconds) > 0 for _, seconds, _ in medians), out
