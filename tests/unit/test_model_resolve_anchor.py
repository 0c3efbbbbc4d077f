"""A relative local model path is made absolute before it travels to Ray workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.models.resolve import anchored_name


def test_a_relative_model_directory_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert anchored_name("models/tiny") == str(tmp_path / "models" / "tiny")
    assert anchored_name("./models/tiny") == str(tmp_path / "models" / "tiny")


def test_hub_ids_builtin_names_and_absolute_paths_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert anchored_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert anchored_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert anchored_name(str(tmp_path)) == str(tmp_path)
