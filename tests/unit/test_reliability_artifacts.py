"""Untrusted artifacts: rayft unpickles nothing but tensors and plain values, writes weights only as
safetensors, and runs a model's own code only when it is pinned to a commit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "rayft"


def calls(pattern: str) -> list[tuple[str, str]]:
    """(file, line) of every source line of rayft matching ``pattern``."""
    found = []
    for path in SRC.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.search(pattern, line):
                found.append((str(path.relative_to(SRC)), line.strip()))
    return found


def test_every_torch_load_is_restricted_to_tensors_and_plain_values() -> None:
    loads = calls(r"torch\.load\(")
    assert loads, "the scan found no torch.load call at all; has the pattern gone stale?"
    assert [c for c in loads if "weights_only=True" not in c[1]] == []
    assert calls(r"\bpickle\.loads?\(|\bdill\.|cloudpickle\.loads?\(") == []


def test_weights_are_saved_as_safetensors_only() -> None:
    saves = calls(r"\.save_pretrained\(")
    model_saves = [c for c in saves if "inner.save_pretrained" in c[1] or "model.save_pretrained" in c[1]]
    assert model_saves and all("safe_serialization=True" in c[1] for c in model_saves), model_saves


def test_remote_code_needs_a_revision_pinned_to_a_commit() -> None:
    with pytest.raises(ConfigError, match=r"trust_remote_code=true needs 'revision' pinned to a 40-character commit"):
        load_config(None, ["model.name=org/model", "model.trust_remote_code=true"])
    with pytest.raises(ConfigError, match=r"got 'main'"):
        load_config(None, ["model.name=org/model", "model.trust_remote_code=true", "model.revision=main"])
    pinned = load_config(None, ["model.name=org/model", "model.trust_remote_code=true", f"model.revision={'a1' * 20}"])
    assert pinned.model.trust_remote_code and pinned.model.revision == "a1" * 20
    assert load_config(None, []).model.trust_remote_code is False  # off unless asked for
