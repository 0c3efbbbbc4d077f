"""train.allocator on real Ray Train workers: jemalloc is in each worker's process from its start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.training.loop.heap import find_jemalloc
from tests.support.allocator import RECORDER
from tests.support.runs import tiny_config, train_on

pytestmark = pytest.mark.integration


@pytest.mark.skipif(find_jemalloc((sys.prefix,)) is None, reason="needs libjemalloc2 (apt-get install libjemalloc2)")
@pytest.mark.parametrize(("choice", "want"), [("jemalloc", "jemalloc"), ("glibc", "the C library's")])
@pytest.mark.usefixtures("ray_session")
def test_each_worker_runs_on_the_allocator_the_config_names(
    tiny_model_dir: Path, arithmetic_units: PreparedData, tmp_path: Path, choice: str, want: str
) -> None:
    out = tmp_path / "allocators"
    callbacks = [{"target": RECORDER, "options": {"out": str(out)}}]
    cfg = tiny_config(
        tiny_model_dir, tmp_path / "runs", "train.max_steps=1", "train.eval_steps=null",
        f"train.allocator={choice}", f"train.callbacks={json.dumps(callbacks)}",
    )  # fmt: skip
    train_on(cfg, arithmetic_units)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"rank-0": want, "rank-1": want}
