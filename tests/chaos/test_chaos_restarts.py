"""A training run restarts its workers by itself: after a worker is SIGKILLed mid-run, and after Ray's
memory monitor kills a process of the run under real memory pressure (a Ray head of its own, started
with a low ``RAY_memory_usage_threshold``, and a worker that allocates until it is killed). Each ends
with the per-step losses and the adapter weights of an uninterrupted run, bit for bit, and one line
per restart on the console. With ``failure.max_failures=0``, ``rayft train`` ends with a short
paragraph (what happened, the last checkpoint, the ``--resume`` command, no traceback on the
console, Ray's report in the run's log) and exit code 75; the printed command finishes the run."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayft.data.prepared import PreparedData
from tests.chaos.conftest import REPO, gcs_address, run_driver, start_driver, started_at
from tests.support.faults import ALLOCATE_UNTIL_KILLED, ENV_FAULTS
from tests.support.ray_head import ray_head
from tests.support.ray_state import train_workers
from tests.support.runs import RESUME_RUN, adapter_tensors, read_metrics, train_losses

pytestmark = pytest.mark.chaos

RESTART = re.compile(r"restarting the workers from checkpoint step (\d+) \(attempt (\d+) of (\d+)\)")


def own_output(err: str) -> str:
    """The driver's output less what Ray forwards from Ray Train's placement-group cleaner, which on a
    Ray without a dashboard (this one's) fails every second with a traceback of its own."""
    return "\n".join(line for line in err.splitlines() if "(PlacementGroupCleaner" not in line)


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Every step's loss and every adapter weight equal the reference's, bit for bit."""
    assert train_losses(run_dir) == train_losses(reference)
    want, got = adapter_tensors(reference / "final"), adapter_tensors(run_dir / "final")
    assert want.keys() == got.keys() and all(got[name].equal(tensor) for name, tensor in want.items())


def last_step(run_dir: Path) -> int:
    """The last training step in metrics.jsonl (0 before the first)."""
    try:
        return max((r["step"] for r in read_metrics(run_dir) if "train/loss" in r), default=0)
    except (OSError, ValueError):  # not written yet, or a line being written
        return 0


def kill_when_held(process: subprocess.Popen[str], run_dir: Path, step: int, since: float, marker: str) -> int:
    """Once ``run_dir`` logged ``step`` (its workers held before the next one), SIGKILL the worker of
    this run (its environment holds ``marker``) with the highest rank's pid; return that pid."""
    while process.poll() is None:
        if last_step(run_dir) >= step:
            workers = [w for w in train_workers(since, ours=False) if marker in w.environ().values()]
            if workers:
                victim = max(workers, key=lambda w: w.pid)
                os.kill(victim.pid, signal.SIGKILL)
                return int(victim.pid)
        time.sleep(0.05)
    raise AssertionError(f"the run ended before step {step}:\n{process.communicate()[1][-3000:]}")


def test_a_worker_killed_mid_run_is_restarted_from_the_last_checkpoint_by_the_run_itself(
    tiny_model_dir: Path, prepared: PreparedData, uninterrupted_run: Path, tmp_path: Path
) -> None:
    # Held before step 6 (the release file appears only after the kill): the kill lands after step 5,
    # past the checkpoint of step 3, however fast the machine trains.
    release = tmp_path / "released"
    hold = {"RAYFT_FAULT_HOLD": f"6:{release}"}
    driver = start_driver(prepared, tiny_model_dir, tmp_path, *RESUME_RUN, address=gcs_address(), env=hold)
    since = started_at(driver)
    while last_step(tmp_path / "run") < 5:
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        time.sleep(0.05)
    workers = train_workers(since)  # this driver's: started on this process's Ray after it
    assert workers, "no Ray Train worker of this run found"
    os.kill(workers[-1].pid, signal.SIGKILL)
    release.touch()
    _, err = driver.communicate(timeout=600)

    assert driver.returncode == 0, err[-4000:]
    restarts = [m.groups() for m in RESTART.finditer(err)]
    assert restarts == [("3", "1", "3")], err[-4000:]
    assert re.search(r"worker \d died \(killed by a signal, or the process crashed\) on node \S+ after step 5", err)
    assert "Traceback" not in own_output(err), err[-4000:]
    assert_same_run(tmp_path / "run", uninterrupted_run)


def memory_threshold(margin_bytes: int) -> tuple[float, int]:
    """A ``RAY_memory_usage_threshold`` ``margin_bytes`` above the node's memory use now, and how much
    a worker may allocate to get past it (leaving the machine 3 GiB, whatever others use)."""
    import psutil

    memory = psutil.virtual_memory()
    used = memory.total - memory.available
    threshold = (used + margin_bytes) / memory.total
    room = memory.available - 3 * 2**30
    if threshold >= 0.95 or room <= margin_bytes:  # others use this machine's memory: no room to press it safely
        pytest.skip(
            f"needs {(margin_bytes + 3 * 2**30) / 2**30:.0f} GiB of free memory, has {memory.available / 2**30:.1f}"
        )
    return round(threshold, 4), min(room, 8 * 2**30)


# Ray's memory monitor reads the node's memory, not the run's: a test beside this one that grows by more
# than the margin would push the node past the threshold before this run's first step.
@pytest.mark.alone
def test_a_process_killed_by_rays_memory_monitor_under_real_memory_pressure_is_restarted_by_the_run(
    tiny_model_dir: Path, prepared: PreparedData, uninterrupted_run: Path, tmp_path: Path
) -> None:
    threshold, room = memory_threshold(margin_bytes=3 * 2**30)  # the head, the driver and 2 workers fit in it
    head_env = {"RAY_memory_usage_threshold": str(threshold), "RAY_memory_monitor_refresh_ms": "100"}
    marker = tmp_path / "allocated"
    callback = (
        f"train.callbacks=[{{target: '{ALLOCATE_UNTIL_KILLED}', options: {{rank: 1, step: 5, "
        f"marker: '{marker}', limit_mb: {room // 2**20}}}}}]"
    )
    with ray_head(num_cpus=2, dashboard=False, env=head_env) as head:
        finished = run_driver(prepared, tiny_model_dir, tmp_path, *RESUME_RUN, callback, "failure.max_failures=5",
                              address=head.gcs, env=head.env, timeout_s=900)  # fmt: skip
        assert finished.returncode == 0, finished.stderr[-4000:]
        assert marker.exists(), "the worker never got to allocate"
    err = finished.stderr
    restarts = [line for line in err.splitlines() if RESTART.search(line)]
    assert restarts, err[-4000:]
    memory = [line for line in restarts if "was killed by Ray's memory monitor: node memory" in line]
    assert memory, f"no restart names the memory monitor:\n{err[-4000:]}"
    assert re.search(r"> threshold [\d.]+% on node \S+ after step \d+; restarting the workers from", memory[0])
    assert "Traceback" not in own_output(err), err[-4000:]
    assert_same_run(tmp_path / "run", uninterrupted_run)


def test_a_run_joined_to_one_of_two_heads_on_a_machine_prints_no_ray_stack(
    tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path
) -> None:
    # Ray Train's placement-group cleaner asks the state API for the cluster "auto"; with two heads on
    # the machine (this one, and the shared Ray of these tests) that ends its thread with a traceback
    # unless the job names its cluster.
    gcs_address()
    with ray_head(num_cpus=2, dashboard=True) as head:
        finished = run_driver(prepared, tiny_model_dir, tmp_path, "train.max_steps=4", "train.save_steps=2",
                              "train.eval_steps=null", "scaling.num_workers=1", address=head.gcs, env=head.env,
                              timeout_s=600)  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-4000:]
    assert "Traceback" not in finished.stderr and "multiple active Ray instances" not in finished.stderr, (
        finished.stderr[-4000:]
    )


def rayft_train(config: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``rayft train CONFIG ARGS`` in a subprocess on a Ray of its own, from the directory of ``config``."""
    return subprocess.Popen(
        [sys.executable, "-m", "rayft", "train", str(config), *args], cwd=config.parent, env={**os.environ, **env},
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_with_no_retry_left_rayft_train_says_what_happened_and_how_to_resume_and_exits_75(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "small.yaml"
    config.write_text(
        f"name: small\nstorage_path: {tmp_path / 'runs'}\nmodel: {{name: {tiny_model_dir}}}\n"
        "data: {datasets: [{path: 'builtin:arithmetic', max_rows: 64}], validation_fraction: 0.0, "
        "max_seq_length: 256}\nscaling: {num_workers: 1}\nlora: {r: 4}\nlogging: {tensorboard: false}\n"
        "train: {max_steps: 8, micro_batch_size: 2, save_steps: 3, eval_steps: null}\n"
    )
    hold = f"5:{tmp_path / 'never-released'}"  # held before step 5 on every attempt of the first command
    since = time.time()
    first = rayft_train(config, ENV_FAULTS, "failure.max_failures=0", env={"RAYFT_FAULT_HOLD": hold})
    kill_when_held(first, tmp_path / "runs" / "small", 4, since, hold)
    out, err = first.communicate(timeout=300)
    print(out, err)  # what a user sees

    assert first.returncode == 75, err[-4000:]
    assert "Traceback" not in err, err
    # Ray's own report of the kill (lease, worker and node ids), which Ray's driver prints on stdout, is the log's
    assert "A worker died or was killed" not in out + err, out + err
    paragraph = err[err.index("Error: ") :]
    assert re.match(
        r"Error: Worker \d died \(killed by a signal, or the process crashed\) on node \S+ after step 4, no restart "
        r"allowed \(failure.max_failures=0\).\nThe last checkpoint is step 3; continue from it with:\n    rayft train ",
        paragraph,
    ), paragraph
    command = shlex.split(paragraph.splitlines()[2])
    assert command == ["rayft", "train", str(config), ENV_FAULTS, "failure.max_failures=0", "--resume"]
    log = (tmp_path / "runs" / "small" / "logs" / "rayft.log").read_text()
    assert "attempt 1 of the run failed" in log and "Traceback" in log, "Ray's report goes to the run's log file"
    assert "A worker died or was killed" in log

    resumed = rayft_train(config, *command[3:], env={})  # as printed; no hold now
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-4000:]
    assert sorted({r["step"] for r in read_metrics(tmp_path / "runs" / "small") if "train/loss" in r}) == list(
        range(1, 9)
    )


# The repository's root: the workers of the rayft subprocesses import tests.support from it.
assert str(REPO) in os.environ.get("PYTHONPATH", ""), "tests/conftest.py puts the checkout on PYTHONPATH"
