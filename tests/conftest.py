"""Shared fixtures: a tiny model built once per session, and one local Ray for integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
GSM8K_TRAIN = SHARED / "datasets" / "gsm8k" / "train.jsonl"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokenized-data caches go to a per-session temp dir; converted built-in models are shared."""
    if "RAYFT_TEST_KEEP_CACHE" not in os.environ:
        monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "data-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama with a tiny BPE tokenizer and a ChatML template."""
    from rayft.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer T5 v1.1 (gated feed-forward) with the tiny tokenizer, no chat template."""
    from rayft.testing import build_tiny_t5

    return build_tiny_t5(tmp_path_factory.mktemp("tiny-t5"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray (2 CPUs) shared by every integration test of the session."""
    import ray

    from rayft.testing.ray_cluster import start_local_ray

    start_local_ray(num_cpus=2)
    yield
    ray.shutdown()
