"""A sweep's outputs: tune.json round trip, a runnable best.yaml, the console table and tune.html."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import RunStateError
from rayft.tuning.outputs import write_sweep_outputs
from rayft.tuning.report_html import render_sweep_html, trial_color
from rayft.tuning.results import (
    SweepResult,
    TrialRecord,
    load_sweep_result,
    pick_best,
    render_table,
)

BASE = RayftConfig(
    name="demo",
    train={"max_steps": 6, "eval_steps": 2},
    tune={
        "scheduler": "asha",
        "search_space": {"train.learning_rate": {"loguniform": [1e-5, 1e-2]}, "lora.r": {"choice": [4, 8]}},
    },
)


def trial(tid: str, lr: float, r: int, history: list[tuple[int, float]], status: str = "TERMINATED") -> TrialRecord:
    last = history[-1][1] if history else None
    best = min((v for _, v in history), default=None)
    reason = "stopped by asha at step 2" if status == "STOPPED_EARLY" else ("finished" if history else "")
    return TrialRecord(
        trial_id=tid,
        params={"train.learning_rate": lr, "lora.r": r},
        metric=last,
        best_metric=best,
        steps=history[-1][0] if history else 0,
        status=status,  # type: ignore[arg-type]
        stop_reason=reason,
        run_dir=f"runs/demo-tune/{tid}",
        history=history,
    )


def sweep() -> SweepResult:
    trials = [
        trial("t1", 1e-2, 4, [(2, 3.0), (4, 2.9), (6, 2.8)]),
        trial("t2", 3e-4, 8, [(2, 2.5), (4, 2.1), (6, 1.9)]),
        trial("t3", 9e-3, 8, [(2, 4.0)], status="STOPPED_EARLY"),
        trial("t4", 1e-5, 4, [], status="ERROR"),
    ]
    return SweepResult("demo-tune", "eval/loss", "min", trials, pick_best(trials, "min"))


def test_pick_best_follows_mode_and_skips_missing_and_nan() -> None:
    trials = sweep().trials
    assert pick_best(trials, "min") == "t2" and pick_best(trials, "max") == "t3"
    nan = trial("t5", 1e-3, 4, [(2, math.nan)])
    assert pick_best([nan, trials[3]], "min") is None


def test_outputs_round_trip_and_best_yaml_runs_the_best_trial(tmp_path: Path) -> None:
    result = sweep()
    write_sweep_outputs(tmp_path, result, BASE)
    assert load_sweep_result(tmp_path) == result
    best = load_config(tmp_path / "best.yaml")
    assert best.tune is None and best.name == "demo-tune-best"
    assert (best.train.learning_rate, best.lora.r, best.train.max_steps) == (3e-4, 8, 6)
    text = (tmp_path / "best.yaml").read_text()
    assert text.startswith("# rayft train best.yaml") and "\ntune:" not in text
    assert "best trial <b>t2</b>" in (tmp_path / "tune.html").read_text()


def test_no_metric_means_no_best_yaml(tmp_path: Path) -> None:
    (tmp_path / "best.yaml").write_text("stale")
    failed = [trial("t4", 1e-5, 4, [], status="ERROR")]
    write_sweep_outputs(tmp_path, SweepResult("demo-tune", "eval/loss", "min", failed, None), BASE)
    assert not (tmp_path / "best.yaml").exists() and (tmp_path / "tune.json").is_file()


def test_loading_a_missing_or_foreign_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RunStateError, match="does not exist; run `rayft tune CONFIG` first"):
        load_sweep_result(tmp_path)
    (tmp_path / "tune.json").write_text('{"steps": 3}')
    with pytest.raises(RunStateError, match="is not a sweep result"):
        load_sweep_result(tmp_path)


def test_console_table_best_first_with_reasons() -> None:
    lines = render_table(sweep()).splitlines()
    assert lines[0].split() == [
        "trial",
        "train.learning_rate",
        "lora.r",
        "eval/loss",
        "steps",
        "status",
        "why",
        "stopped",
    ]
    assert lines[2].split() == ["*", "t2", "0.0003", "8", "1.9", "6", "TERMINATED", "finished"]
    assert lines[4].split()[:7] == ["t3", "0.009", "8", "4", "2", "STOPPED_EARLY", "stopped"]
    assert lines[5].split() == ["t4", "1e-05", "4", "-", "0", "ERROR"]


def test_html_has_a_series_per_reporting_trial_and_a_log_axis() -> None:
    page = render_sweep_html(sweep(), BASE.tune)
    assert page.count('class="series"') == 3 and 'data-trial="t4"' not in page
    assert 'data-trial="t2" points=' in page and f'stroke="{trial_color(1)}" stroke-width="3"' in page
    assert "train.learning_rate (log)</text>" in page and "lora.r</text>" in page
    assert page.count('class="point"') == 6  # three trials with a metric, two hyper-parameters
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
