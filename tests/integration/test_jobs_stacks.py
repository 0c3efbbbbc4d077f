"""`rayft jobs stacks` on a live job: a training run submitted to a real `ray start --head` is held
before its third step, and py-spy's dump of every one of its Ray Train workers comes back and shows
the worker held in rayft's training loop."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faults import FAULT_INJECTOR
from tests.support.ray_head import RayHead, ray_head
from tests.support.ray_state import train_workers
from tests.support.runs import train_losses

pytestmark = pytest.mark.integration

RAYFT = str(Path(sys.executable).parent / "rayft")
HELD_STEP = 3
SECTION = re.compile(r"^=== (\S+) pid (\d+) on (\S+) \(node [0-9a-f]+\) ===$", re.MULTILINE)


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """The file whose creation lets the held run go on."""
    return tmp_path / "released"


@pytest.fixture
def hold(release: Path) -> str:
    """``RAYFT_FAULT_HOLD`` of the held runs: before step HELD_STEP until ``release`` exists."""
    return f"{HELD_STEP}:{release}"


@pytest.fixture
def held_head(hold: str) -> Iterator[RayHead]:
    """A head whose jobs hold every training run (the head's environment is its jobs')."""
    with ray_head(num_cpus=2, env={"RAYFT_FAULT_HOLD": hold}) as started:
        yield started


def _rayft(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "RAY_ADDRESS": "", **env}
    return subprocess.run([RAYFT, *args], env=full, capture_output=True, text=True, timeout=timeout, check=False)


def _sections(output: str) -> dict[int, tuple[str, str]]:
    """What `rayft jobs stacks` printed, by process id: the kind of process and its stacks."""
    heads = list(SECTION.finditer(output))
    ends = [h.start() for h in heads[1:]] + [len(output)]
    return {int(h.group(2)): (h.group(1), output[h.end() : end]) for h, end in zip(heads, ends, strict=True)}


def test_stacks_of_a_held_job_show_every_worker_in_the_training_loop(
    held_head: RayHead, hold: str, release: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The CLI runs from this environment's bin, not on the PATH: it finds py-spy there all the same.
    assert (Path(RAYFT).parent / "py-spy").is_file(), "py-spy comes with ray[default]"
    config = tmp_path / "held.yaml"
    config.write_text(
        f"name: held\nstorage_path: {tmp_path / 'runs'}\nmodel: {{name: {tiny_model_dir}}}\n"
        "data:\n  datasets: [{path: 'builtin:arithmetic', max_rows: 40}]\n  validation_fraction: 0.1\n"
        "scaling: {num_workers: 2}\nlora: {r: 4}\nlogging: {tensorboard: false}\n"
        "train: {max_steps: 4, micro_batch_size: 4, logging_steps: 1, save_steps: 1000, eval_steps: null,\n"
        f"        callbacks: ['{FAULT_INJECTOR}']}}\n"
    )
    workdir = tmp_path / "project"
    workdir.mkdir()
    since = time.time()
    address = ("--address", str(held_head.jobs_url))
    started = _rayft("submit", str(config), *address, "--working-dir", str(workdir), "--no-follow", env=held_head.env)
    assert started.returncode == 0, started.stderr[-3000:]
    found = re.search(r"Submitted job (\S+)", started.stdout)
    assert found, started.stdout
    job = found.group(1)
    run_dir = tmp_path / "runs" / "held"
    deadline = time.monotonic() + 600  # a backstop against a job that never trains, not a time limit
    while not (run_dir / "metrics.jsonl").is_file() or HELD_STEP - 1 not in train_losses(run_dir):
        assert time.monotonic() < deadline, "the job never reached its held step"
        time.sleep(0.5)

    try:
        dumped = _rayft("jobs", "stacks", job, *address, env=held_head.env, timeout=120)
    finally:
        release.touch()
    assert dumped.returncode == 0, dumped.stdout[-3000:] + dumped.stderr[-3000:]
    stacks = _sections(dumped.stdout)
    # This head's workers, not those of another Ray on the machine: they inherited its environment.
    workers = {w.pid for w in train_workers(since, ours=False) if w.environ().get("RAYFT_FAULT_HOLD") == hold}
    assert len(workers) == 2 and workers <= stacks.keys(), (workers, dumped.stdout[-3000:])
    for pid in workers:
        kind, text = stacks[pid]
        assert kind == "RayTrainWorker" and "py-spy could not read" not in text, text
        # Held in the tests' fault callback, called from the worker loop.
        assert re.search(r"on_step_begin \(\S*tests/support/faults\.py:\d+\)", text), text
        assert re.search(r"\(\S*rayft/training/loop/worker\.py:\d+\)", text), text
    drivers = [text for kind, text in stacks.values() if kind == "DRIVER"]
    assert len(drivers) == 1 and "rayft/" in drivers[0], dumped.stdout[:3000]

    finished = _rayft("jobs", "logs", job, *address, "--follow", env=held_head.env, timeout=600)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert sorted(train_losses(run_dir)) == [1, 2, 3, 4]
