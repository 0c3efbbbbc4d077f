"""The step breakdown, the straggler and bottleneck planners, the trace window and `rayft profile`,
without Ray."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.cluster.stacks import JobWorker, local_ips, plan_stack_sources, py_spy_path, select_job_processes
from rayft.config.train import ProfileConfig
from rayft.runs import layout
from rayft.training.profiling.breakdown import StepTimer, model_flops_utilization, peak_flops
from rayft.training.profiling.diagnosis import diagnose, find_straggler, merge_windows
from rayft.training.profiling.report import load_profile, profile_section, profile_text
from rayft.training.profiling.trace import open_trace_window


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rank(index: int, step: float, comm: float = 0.0, data: float = 0.0, **more: float) -> dict[str, object]:
    row: dict[str, object] = {"rank": index, "node": f"node-{index}", "time/step": step, "time/comm": comm}
    row["time/data_wait"] = data
    row["time/forward"] = row["time/backward"] = (step - comm - data) / 2
    row.update({f"time/{k}" if not k.startswith("memory") else k.replace("_", "/", 1): v for k, v in more.items()})
    return row


def test_the_phases_of_a_step_add_up_to_its_wall_time_but_for_what_is_skipped() -> None:
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start()
    for _ in range(4):
        for phase, seconds in (("data_wait", 0.5), ("comm", 0.1), ("forward", 1.0), ("backward", 2.0),
                               ("optimizer", 0.3), ("comm", 0.1)):  # fmt: skip
            clock.now += seconds
            timer.lap(phase)
        timer.end_step()
        clock.now += 0.25  # logging the metrics
        timer.skip()
    means = timer.take()
    assert means["time/data_wait"] == pytest.approx(0.5)
    assert means["time/comm"] == pytest.approx(0.2)
    assert means["time/backward"] == pytest.approx(2.0)
    # The first step has no logging before it; the other three carry the 0.25 s of the step before.
    assert means["time/step"] == pytest.approx(4.0 + 0.25 * 3 / 4)
    assert timer.take() == {}  # a new window with no step in it


def test_parts_of_a_phase_are_reported_beside_it_per_step() -> None:
    clock = FakeClock()
    timer = StepTimer(clock=clock)
    timer.start()
    for _ in range(2):
        clock.now += 3.0
        timer.lap("rollout")
        timer.part("rollout_sample", 2.0)  # multi-turn episodes: sampling, then the environment's steps
        timer.part("rollout_tools", 1.0)
        timer.end_step()
    means = timer.take()
    assert means["time/rollout"] == 3.0 and means["time/rollout_sample"] == 2.0 and means["time/rollout_tools"] == 1.0
    assert means["time/step"] == 3.0
    clock.now += 1.0
    timer.lap("forward")
    timer.end_step()
    assert "time/rollout_sample" not in timer.take()  # a window without episodes has no parts


def test_a_disabled_timer_records_nothing() -> None:
    clock = FakeClock()
    timer = StepTimer(enabled=False, clock=clock)
    timer.start()
    clock.now += 1.0
    timer.lap("forward")
    timer.end_step()
    assert timer.take() == {}


def test_mfu_needs_a_known_peak() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA L40S") == 362e12 and peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("cpu") is None
    assert model_flops_utilization(100, 1000.0, None) is None
    assert model_flops_utilization(135_000_000, 100_000.0, 989e12) == pytest.approx(6 * 135e6 * 1e5 / 989e12)


def test_the_slowest_rank_is_a_straggler_only_past_the_margin() -> None:
    # Fast ranks wait for the slow one in collectives: busy time (step less comm) tells them apart.
    ranks = [rank(0, 1.0, comm=0.6), rank(1, 1.0, comm=0.05), rank(2, 1.0, comm=0.58), rank(3, 1.0, comm=0.61)]
    straggler = find_straggler(ranks, margin=0.2)
    assert straggler is not None and straggler.rank == 1 and straggler.node == "node-1"
    assert straggler.slowdown == pytest.approx(0.95 / 0.4)
    assert "rank 1 on node node-1" in straggler.describe()
    even = [rank(0, 1.0, comm=0.1), rank(1, 1.0, comm=0.05)]
    assert find_straggler(even, margin=0.2) is None  # 0.95 against 0.9: within 20%
    assert find_straggler([rank(0, 1.0)], margin=0.2) is None


def test_two_ranks_compare_the_slower_with_the_faster() -> None:
    straggler = find_straggler([rank(0, 1.0, comm=0.5), rank(1, 1.0, comm=0.0)], margin=0.2)
    assert straggler is not None and straggler.rank == 1


@pytest.mark.parametrize(
    ("ranks", "verdict"),
    [
        ([rank(0, 1.0, data=0.6), rank(1, 1.0, data=0.55)], "data-bound"),
        ([rank(0, 1.0, comm=0.5), rank(1, 1.0, comm=0.45)], "communication-bound"),
        ([rank(0, 1.0, checkpoint=0.4), rank(1, 1.0, checkpoint=0.4)], "checkpoint-bound"),
        ([rank(0, 1.0, memory_peak_fraction=0.97)], "memory-bound"),
        ([rank(0, 1.0, comm=0.6), rank(1, 1.0, comm=0.0)], "straggler"),
        ([rank(0, 1.0, data=0.05, comm=0.05), rank(1, 1.0, data=0.05, comm=0.05)], "compute-bound"),
    ],
)
def test_the_verdict_names_what_bounds_the_run(ranks: list[dict[str, object]], verdict: str) -> None:
    findings = diagnose(ranks, margin=0.2)
    assert findings[0].verdict == verdict
    assert findings[0].fix


def test_one_straggler_does_not_make_the_run_data_bound() -> None:
    # The slow rank waits for its data; the others, typical, do not.
    ranks = [rank(0, 1.0, comm=0.6), rank(1, 1.0, data=0.6, comm=0.0), rank(2, 1.0, comm=0.6)]
    assert [f.verdict for f in diagnose(ranks, margin=0.2)] == ["straggler"]


def test_windows_merge_weighted_by_their_steps_and_memory_keeps_its_peak() -> None:
    windows = [
        {"step": 2, "steps": 2, "ranks": [{**rank(0, 1.0), "memory/peak_fraction": 0.5}]},
        {"step": 3, "steps": 1, "ranks": [{**rank(0, 4.0), "memory/peak_fraction": 0.7}]},
    ]
    (merged,) = merge_windows(windows)
    assert merged["time/step"] == pytest.approx(2.0) and merged["steps"] == 3
    assert merged["memory/peak_fraction"] == 0.7


def write_windows(run_dir: Path, *windows: dict[str, object]) -> None:
    path = run_dir / layout.STEP_TIMES_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(w) + "\n" for w in windows))


def test_rayft_profile_prints_the_breakdown_verdict_and_fix_and_writes_the_page(tmp_path: Path) -> None:
    run_dir = tmp_path / "my-run"
    write_windows(run_dir, {"step": 2, "steps": 2, "ranks": [rank(0, 0.5, data=0.3), rank(1, 0.5, data=0.3)]})
    result = CliRunner().invoke(cli, ["profile", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "Verdict: data-bound (60% of the step waiting for data)" in result.output
    assert "Fix: the loop waits for its batches" in result.output
    page = (run_dir / layout.PROFILE_PAGE).read_text()
    assert "<h2>Where the time goes</h2>" in page and "data-bound" in page and "<!DOCTYPE html>" in page
    profile = load_profile(run_dir)
    assert "node-1" in profile_text(profile) and "node-1" in profile_section(profile)


def test_rayft_profile_of_a_run_without_a_breakdown_says_how_to_get_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["profile", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and "train.profile.step_timing host" in result.output
    assert "Traceback" not in result.output
    missing = CliRunner().invoke(cli, ["profile", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_stacks_are_read_locally_only_for_workers_here_with_py_spy() -> None:
    workers = [JobWorker(10, "a", "10.0.0.1", "WORKER"), JobWorker(11, "b", "10.0.0.2", "WORKER")]
    assert plan_stack_sources(workers, {"10.0.0.1"}, py_spy_here=True) == ["local", "dashboard"]
    assert plan_stack_sources(workers, {"10.0.0.1"}, py_spy_here=False) == ["dashboard", "dashboard"]


def test_a_jobs_processes_are_its_live_actors_and_its_driver() -> None:
    rows = [(10, "n1", "10.0.0.1", True), (11, "n2", "10.0.0.2", True), (12, "n1", "10.0.0.1", False),
            (13, "n1", "10.0.0.1", True), (14, "n2", "10.0.0.2", True)]  # fmt: skip
    kinds = {11: "RayTrainWorker", 12: "RayTrainWorker", 14: "TrainController", 10: "DRIVER", 99: "RayTrainWorker"}
    assert select_job_processes(rows, kinds) == [
        JobWorker(10, "n1", "10.0.0.1", "DRIVER"),
        JobWorker(11, "n2", "10.0.0.2", "RayTrainWorker"),
        JobWorker(14, "n2", "10.0.0.2", "TrainController"),
    ]  # dead (12), another job's (13) and not listed (99) are left out


def test_every_address_of_this_machine_is_local() -> None:
    """Ray may report a node here by an address the host name does not resolve to (an interface's)."""
    import subprocess

    listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    assert {ip for ip in listed if ":" not in ip} | {"127.0.0.1"} <= local_ips()


def test_py_spy_is_found_beside_this_python_when_the_path_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """ray[default] installs py-spy into the environment's bin, which an unactivated venv leaves off the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    assert beside.is_file(), "py-spy comes with ray[default]: pip install 'ray[default]'"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert py_spy_path() == str(beside)


def test_the_trace_window_records_its_steps_only(tmp_path: Path) -> None:
    import torch

    written: list[Path] = []
    cfg = ProfileConfig(wait_steps=2, warmup_steps=1, active_steps=2, activities=["cpu", "cuda"])
    window = open_trace_window(cfg, tmp_path, rank=3, device_type="cpu", on_written=written.append)
    assert window is not None
    weights = torch.randn(64, 64)
    for _ in range(8):
        (weights @ weights).sum()
        window.step()
    window.close()
    assert written == [tmp_path / layout.trace_file(3)]
    events = json.loads(written[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}
    assert open_trace_window(ProfileConfig(), tmp_path, 0, "cpu", written.append) is None  # no window set
    assert open_trace_window(cfg.model_copy(update={"ranks": [0]}), tmp_path, 3, "cpu", written.append) is None


def test_the_pipeline_report_carries_the_training_runs_profile(tmp_path: Path) -> None:
    from rayft.pipeline.report import ReportInputs, render_report
    from rayft.training.profiling.report import read_profile

    write_windows(tmp_path, {"step": 2, "steps": 2, "ranks": [rank(0, 0.5, comm=0.3), rank(1, 0.5, comm=0.28)]})
    profile = read_profile(tmp_path)
    assert profile is not None and profile.findings[0].verdict == "communication-bound"
    page = render_report(ReportInputs(name="run", stages=(), profile_section=profile_section(profile)))
    assert "<h2>Where the time goes</h2>" in page and "communication-bound" in page and "<svg" in page
    assert "Where the time goes" not in render_report(ReportInputs(name="run", stages=()))
