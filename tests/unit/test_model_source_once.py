"""A run resolves its model's source once: every part of a train (the data cache key, the tokenizer,
the architecture, the step planner, the model load) is handed the one :class:`ModelSource`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.models import resolve
from rayft.models.resolve import ModelSource, resolve_model_source, sources_resolved_once


def count_classifications(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str | None, str | None]]:
    """Count the real classifications of each source (each call still runs the real function)."""
    real = resolve.classify_model_source
    counts: Counter[tuple[str, str | None, str | None]] = Counter()

    def counting(name: str, gguf_file: str | None = None, revision: str | None = None) -> ModelSource:
        counts[(name, gguf_file, revision)] += 1
        return real(name, gguf_file, revision)

    monkeypatch.setattr(resolve, "classify_model_source", counting)
    return counts


def test_a_train_resolves_its_model_source_once(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.recipes.train import run

    counts = count_classifications(monkeypatch)
    cfg = load_config(None, [
        f"model.name={tiny_model_dir}", f"storage_path={tmp_path}", "name=run", "scaling.num_workers=0",
        "data.datasets=[{path: 'builtin:arithmetic', max_rows: 16}]", "train.micro_batch_size=2",
        "train.max_steps=1", "train.eval_steps=null", "lora.r=4", "logging.tensorboard=false",
    ])  # fmt: skip
    result = run(cfg)
    assert result.steps == 1
    assert counts == {(str(tiny_model_dir), None, None): 1}, counts


def test_inside_a_run_every_ask_gets_the_same_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = count_classifications(monkeypatch)
    with sources_resolved_once():
        first = resolve_model_source(str(tmp_path), revision="main")
        with sources_resolved_once():  # a worker in its driver's process shares the driver's sources
            assert resolve_model_source(str(tmp_path), revision="main") is first
        assert resolve_model_source(str(tmp_path), revision="v2") is not first  # another source
    assert counts == {(str(tmp_path), None, "main"): 1, (str(tmp_path), None, "v2"): 1}


def test_outside_a_run_a_name_is_resolved_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived process sees a model directory created after a name was first resolved."""
    monkeypatch.chdir(tmp_path)
    assert resolve_model_source("org/model").kind == "hub"
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert resolve_model_source("org/model").kind == "local"
