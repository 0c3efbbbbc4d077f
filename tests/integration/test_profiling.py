"""The step breakdown on 2 Ray Train workers (gloo, CPU): a slowed loader is called data-bound, a
slowed rank is named the straggler, every rank writes a trace of its window, and the time/*
components add up to the measured step time."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from rayft.runs import layout
from rayft.training.profiling.breakdown import PHASES
from rayft.training.profiling.report import load_profile
from tests.support.runs import read_metrics, tiny_config, train_on

pytestmark = pytest.mark.integration

PROFILED = ("train.max_steps=8", "train.logging_steps=2", "train.save_steps=100", "train.eval_steps=null")


def train_records(run_dir: Path) -> list[dict[str, float]]:
    return [r for r in read_metrics(run_dir) if "train/loss" in r]


def test_a_slow_loader_is_data_bound_and_the_phases_add_up_to_the_step(
    ray_session: None, tiny_model_dir: Path, arithmetic_units: PreparedData, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("RAYFT_FAULT_DATA_DELAY_S", "0.25")
    # The claim is that a delay both ranks share names no straggler. The default margin (20%) also
    # names a rank that the machine alone slowed (other processes beside the test took its CPU): a
    # rank must be twice as busy as the other here, which the shared delay cannot make it.
    settings = (*PROFILED, "train.profile.straggler_margin=1.0")
    run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, *settings), arithmetic_units)

    profile = load_profile(run_dir)
    assert profile.findings[0].verdict == "data-bound", profile.findings
    assert [row["rank"] for row in profile.ranks] == [0, 1]
    records = train_records(run_dir)
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    for before, record in itertools.pairwise(records):
        # The wall time between two log lines, read from their timestamps, is the time of the steps between.
        measured = (record["time"] - before["time"]) / 2
        components = sum(record[f"time/{phase}"] for phase in PHASES)
        assert components == pytest.approx(measured, rel=0.05), (components, measured, record)
        assert record["time/step"] == pytest.approx(measured, rel=0.05)
        assert record["time/data_wait"] >= 0.25
        assert record["time/straggler_rank"] == -1


def test_a_slow_rank_is_named_and_every_rank_writes_its_trace(
    ray_session: None, tiny_model_dir: Path, arithmetic_units: PreparedData, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("RAYFT_FAULT_SLOW_RANK", "1:0.4")
    window = ("train.profile.wait_steps=2", "train.profile.warmup_steps=1", "train.profile.active_steps=2")
    run_dir = train_on(tiny_config(tiny_model_dir, tmp_path, *PROFILED, *window), arithmetic_units)

    assert [r["time/straggler_rank"] for r in train_records(run_dir)][1:] == [1, 1, 1]
    profile = load_profile(run_dir)
    assert profile.findings[0].verdict == "straggler"
    assert "rank 1 on node" in profile.findings[0].detail
    assert profile.traces == [layout.trace_file(0), layout.trace_file(1)]
    for trace in profile.traces:
        events = json.loads((run_dir / trace).read_text())["traceEvents"]
        steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert steps == {"ProfilerStep#3", "ProfilerStep#4"}, (trace, steps)
        assert any(e.get("name") == "aten::mm" for e in events)  # the model's matrix products are in it
