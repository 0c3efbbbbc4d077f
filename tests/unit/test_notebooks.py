"""The example notebooks are committed without outputs, call only the public API, and are in the docs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import rayft
from tests.support.notebooks import NOTEBOOKS, NOTEBOOKS_DIR

ROOT = NOTEBOOKS_DIR.parents[1]
# `rayft.<name>` and `rayft.api.<function>` in a code cell; `rayft.testing` (tiny models for the test size)
# is public too.
RAYFT_NAME = re.compile(r"\brayft\.(\w+)")
API_NAME = re.compile(r"\brayft\.api\.(\w+)")
PUBLIC_MODULES = {"testing"}


def cells(path: Path) -> list[dict[str, object]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["cells"])


def code_of(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "code")  # type: ignore[arg-type]


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) == 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    carrying = [
        i for i, c in enumerate(cells(path)) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])
    ]
    assert carrying == [], f"{path.name}: cells {carrying} carry outputs; clear them before committing"


def test_the_output_check_sees_an_output(tmp_path: Path) -> None:
    notebook = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x\n"}]
    (tmp_path / "x.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    with pytest.raises(AssertionError, match="carry outputs"):
        test_notebook_is_committed_without_outputs(tmp_path / "x.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_runs_in_the_python3_kernel(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_calls_only_the_public_api(path: Path) -> None:
    code = code_of(path)
    assert set(RAYFT_NAME.findall(code)) - set(rayft.__all__) - PUBLIC_MODULES == set()
    assert set(API_NAME.findall(code)) - set(rayft.api.__all__) == set()


def test_the_shared_config_loads() -> None:
    cfg = rayft.load_config(NOTEBOOKS_DIR / "pipeline.yaml", ["storage_path=/tmp/notebooks"])
    assert cfg.name == "pipeline"
    assert cfg.scaling.num_workers == 0  # in-process: a laptop runs the notebooks without Ray workers


def test_every_notebook_is_a_docs_page() -> None:
    class Loader(yaml.SafeLoader):  # mkdocs.yml may carry !!python tags; only its nav matters here
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    nav = json.dumps(yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)["nav"])
    assert [p.name for p in NOTEBOOKS if f"notebooks/{p.name}" not in nav] == []
