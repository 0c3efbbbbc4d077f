"""Reliability building blocks without Ray: fault hooks, secret redaction, the resource planner,
the resume decision, the checkpoint writer, and the SIGTERM stop."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rayft.errors import CheckpointError, RunInterruptedError
from rayft.runs.checkpoints import publish_checkpoint, resume_checkpoint
from rayft.runs.layout import STOP_REQUEST_FILE
from rayft.runs.location import RunLocation
from rayft.runs.manifest import verify_checkpoint, write_manifest
from rayft.security import MASK, redact, redact_record, secret_values
from rayft.training.driver.launcher import stop_on_sigterm
from rayft.training.loop.callbacks import StepInfo
from rayft.training.loop.checkpointing import CheckpointWriter
from rayft.training.loop.plan import missing_resources
from tests.support.faults import FAULT_INJECTOR, FaultInjector, fault_callbacks, fault_options

CANARY = "canary-hf-0123456789abcdef"


def make_checkpoint(root: Path, step: int) -> Path:
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "weights.safetensors").write_bytes(bytes(range(256)) * 4)
    write_manifest(directory, step)
    return directory


def test_faults_parse_from_the_environment_and_reject_unknown_points() -> None:
    environ = {"RAYFT_FAULT_KILL_IN_SAVE": "4:before_manifest", "RAYFT_FAULT_HANG": "1:3", "RAYFT_SAMPLE_LOG": "/s"}
    assert fault_callbacks(environ) == [
        {"target": FAULT_INJECTOR, "options": {"kill_in_save": "4:before_manifest", "hang": "1:3", "sample_log": "/s"}}
    ]
    assert fault_callbacks({}) == []
    faults = FaultInjector(**fault_options(environ))
    assert (faults.kill_in_save, faults.hang, faults.sample_log) == ((4, "before_manifest"), (1, 3), "/s")
    with pytest.raises(ValueError, match="must be one of"):
        FaultInjector(kill_in_save="4:somewhere")
    with pytest.raises(RuntimeError, match="injected failure on rank 1 at step 2"):
        FaultInjector(raise_at="1:2").on_step_begin(StepInfo(rank=1, world_size=2, run_dir="", step=2))
    FaultInjector(raise_at="1:2").on_step_begin(StepInfo(rank=0, world_size=2, run_dir="", step=2))  # another rank


def test_a_held_step_waits_for_its_file_on_every_rank_and_other_steps_do_not(tmp_path: Path) -> None:
    release = tmp_path / "release"
    faults = FaultInjector(hold=f"6:{release}")
    faults.on_step_begin(StepInfo(rank=0, world_size=2, run_dir="", step=5))  # another step: returns at once
    passed = threading.Event()
    info = StepInfo(rank=1, world_size=2, run_dir="", step=6)
    waiting = threading.Thread(target=lambda: (faults.on_step_begin(info), passed.set()), daemon=True)
    waiting.start()
    assert not passed.wait(0.3)  # held while the file is missing
    release.touch()
    assert passed.wait(30)
    waiting.join(timeout=30)


def test_a_held_step_also_ends_when_the_rank_sees_a_stop_request(tmp_path: Path) -> None:
    faults = FaultInjector(hold=f"3:{tmp_path / 'never-created'}")
    stop = threading.Event()
    passed = threading.Event()
    info = StepInfo(rank=0, world_size=1, run_dir="", step=3, stop_requested=stop.is_set)
    waiting = threading.Thread(target=lambda: (faults.on_step_begin(info), passed.set()), daemon=True)
    waiting.start()
    assert not passed.wait(0.3)  # held while no stop is requested and the file is missing
    stop.set()  # what StopWatch.requested() says once the driver sent SIGTERM's request
    assert passed.wait(30)
    waiting.join(timeout=30)


def test_redaction_masks_every_credential_of_the_environment() -> None:
    env = {"HF_TOKEN": CANARY, "MY_SERVICE_PASSWORD": "pw-0123456789", "DEBUG": "1", "AWS_SESSION_TOKEN": "short"}
    assert set(secret_values(env)) == {CANARY, "pw-0123456789"}  # short values are not secrets to mask
    text = f"model.name: https://user:{CANARY}@host/x and pw-0123456789"
    assert redact(text, env) == f"model.name: https://user:{MASK}@host/x and {MASK}"


def test_a_log_record_is_masked_in_its_message_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", CANARY)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s in %s", (CANARY, "msg"), None)
    redact_record(record)
    assert record.getMessage() == f"key {MASK} in msg"


def test_missing_resources_names_cpus_gpus_and_memory_with_what_the_cluster_has() -> None:
    nodes = [{"CPU": 2.0, "memory": 8 * 2**30}]
    assert missing_resources({"CPU": 1.0}, 3, nodes) == ["CPU: 3 needed, 2 in the cluster"]
    assert missing_resources({"CPU": 1.0, "GPU": 1.0}, 2, nodes) == ["GPU: 2 needed, 0 in the cluster"]
    assert missing_resources({"CPU": 1.0, "memory": 6 * 2**30}, 2, nodes) == [
        "memory: 12.0 GiB needed, 8.0 GiB in the cluster"
    ]
    assert missing_resources({"CPU": 1.0, "memory": 4 * 2**30}, 2, nodes) == []


def test_resume_refuses_to_restart_from_zero_when_checkpoints_exist_but_none_verifies(tmp_path: Path) -> None:
    assert resume_checkpoint(None, tmp_path) is None  # a fresh run
    good = make_checkpoint(tmp_path, 2)
    bad = make_checkpoint(tmp_path, 4)
    (bad / "weights.safetensors").write_bytes(bytes(1024))
    assert resume_checkpoint(bad, tmp_path) == good  # falls back to the previous one
    (good / "weights.safetensors").write_bytes(bytes(1024))
    with pytest.raises(CheckpointError, match=r"step-000002.*step-000004.*failed verification.*delete"):
        resume_checkpoint(bad, tmp_path)


def test_publish_renames_a_staging_directory_over_an_older_checkpoint_of_the_same_step(tmp_path: Path) -> None:
    old = make_checkpoint(tmp_path, 6)
    (old / "stale.txt").write_text("from before a restart")
    staging = make_checkpoint(tmp_path / "x", 6).rename(tmp_path / ".step-000006.partial-1")
    publish_checkpoint(staging, tmp_path / "step-000006")
    assert not staging.exists() and not (tmp_path / "step-000006" / "stale.txt").exists()
    assert verify_checkpoint(tmp_path / "step-000006") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000006", "x"]


def test_the_background_writer_runs_one_save_at_a_time_and_reraises_its_error() -> None:
    order: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        order.append("first")

    writer = CheckpointWriter(background=True)
    writer.submit(slow)
    writer.submit(lambda: order.append("second"))  # waits for the first
    writer.wait()
    assert order == ["first", "second"]

    def broken() -> None:
        raise OSError("disk full")

    writer.submit(broken)
    with pytest.raises(CheckpointError, match="writing a checkpoint failed: OSError: disk full"):
        writer.wait()


def test_sigterm_asks_the_workers_to_stop_and_raises_a_resume_hint(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "checkpoints", 3)
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(RunInterruptedError, match=r"stopped on SIGTERM after saving checkpoint .*step-000003.*--resume"),
        stop_on_sigterm(RunLocation(tmp_path), grace_s=30),
    ):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not (tmp_path / STOP_REQUEST_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (tmp_path / STOP_REQUEST_FILE).exists()  # what the workers poll
    assert not (tmp_path / STOP_REQUEST_FILE).exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


def test_sigterm_interrupts_a_launch_that_does_not_stop_within_the_grace_period(tmp_path: Path) -> None:
    assert threading.current_thread() is threading.main_thread()
    started = time.monotonic()
    expected = r"did not save within failure.sigterm_grace_s=0.5 s"
    with pytest.raises(RunInterruptedError, match=expected), stop_on_sigterm(RunLocation(tmp_path), grace_s=0.5):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # a launch that never returns
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("then", ["exits", "returns"])
def test_a_grace_that_runs_out_under_ray_trains_sigint_handler_still_stops_with_the_resume_hint(
    tmp_path: Path, then: str
) -> None:
    """Inside a Ray Train fit the grace timer's SIGINT reaches Ray Train's handler, which aborts the run and
    then exits the process (its controller gone) or lets the fit return: either way the stop names the
    last checkpoint, as a KeyboardInterrupt would have."""
    import sys

    make_checkpoint(tmp_path / "checkpoints", 3)
    aborted = threading.Event()

    def like_ray_train(signum: int, frame: object) -> None:
        aborted.set()
        if then == "exits":
            sys.exit(0)

    expected = r"did not save within failure.sigterm_grace_s=0.5 s; the run stopped.*step-000003 \(step 3\)"
    with pytest.raises(RunInterruptedError, match=expected), stop_on_sigterm(RunLocation(tmp_path), grace_s=0.5):
        signal.signal(signal.SIGINT, like_ray_train)  # what each fit installs
        os.kill(os.getpid(), signal.SIGTERM)
        assert aborted.wait(timeout=30)
    assert signal.getsignal(signal.SIGINT) is not like_ray_train


def test_resolved_configs_mask_credentials_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.config import dump_config, load_config

    monkeypatch.setenv("HF_TOKEN", CANARY)
    text = dump_config(load_config(None, [f"storage_path=/mnt/{CANARY}/runs"]))
    assert CANARY not in text and f"/mnt/{MASK}/runs" in text
