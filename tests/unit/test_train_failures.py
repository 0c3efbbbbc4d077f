"""What ended an attempt of a Ray Train run, from Ray's own exception objects (no cluster): the
restart line, the end of a run whose retries are spent, and the loop callbacks' loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.train import CallbackConfig, FailureConfig
from rayft.errors import ConfigError, DataError, TrainingError, WorkersLostError
from rayft.runs.location import RunLocation
from rayft.runs.manifest import write_manifest
from rayft.runs.store import open_store
from rayft.training.driver.failures import describe_failure, restart_line
from rayft.training.driver.restarts import decide_after_failure
from rayft.training.loop.callbacks import StepInfo, load_callbacks

# Ray 2.60's report when its memory monitor killed the Ray Train controller (as seen on this machine).
OOM_REPORT = (
    "2 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
    "e78ee6bd) was 8.67GB used / 23.54GB limit (0.368115)\nOOM kill reason: Memory usage 9304698880B exceeded "
    "threshold of 9301752832B (36.8% of 25276502016B limit)\nSelected to kill: (Task: task name="
    "TrainController.__init__, pid=18690)\n"
)


def died(rank_ip: str = "10.0.0.7", message: str = "its worker process has died") -> Exception:
    """A RayActorError as Ray raises it for a worker process that died."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError

    context = ActorDiedErrorContext(
        error_message=f"The actor is dead because {message}.", node_ip_address=rank_ip, pid=4242,
        class_name="RayTrainWorker", actor_id=b"0" * 16,
    )  # fmt: skip
    return ActorDiedError(context)


def lost(rank_error: dict[int, Exception]) -> Exception:
    """A WorkerGroupError of Ray Train v2, a dead worker's error wrapped as its health check reports it."""
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    wrapped = {
        rank: WorkerHealthCheckFailedError("health check failed", error)
        if "ActorDied" in type(error).__name__
        else error
        for rank, error in rank_error.items()
    }
    return WorkerGroupError("failed", wrapped)


def test_a_killed_worker_is_named_with_its_node_over_the_collective_error_it_caused_on_another_rank() -> None:
    failure = describe_failure(lost({0: RuntimeError("Connection closed by peer"), 1: died()}), FailureConfig())
    assert failure is not None and failure.retryable and failure.lost_worker
    line = restart_line(failure, step=7, resume_step=6, attempt=1, max_failures=3)
    assert line == (
        "worker 1 died (killed by a signal, or the process crashed) on node 10.0.0.7 after step 7; restarting the "
        "workers from checkpoint step 6 (attempt 1 of 3)"
    )


def test_the_controller_killed_by_the_memory_monitor_is_a_lost_process_with_the_node_memory_figures() -> None:
    from ray.exceptions import OutOfMemoryError

    failure = describe_failure(OutOfMemoryError(OOM_REPORT), FailureConfig())
    assert failure is not None and failure.cause == "memory" and failure.node == "192.0.2.2"
    assert failure.what == (
        "the Ray Train controller was killed by Ray's memory monitor: node memory 37% (8.67GB of 23.54GB) > "
        "threshold 36.8%"
    )
    assert restart_line(failure, step=None, resume_step=None, attempt=2, max_failures=2).endswith(
        "before the first step; restarting the workers from the start (no checkpoint yet) (attempt 2 of 2)"
    )


def test_a_lost_node_and_a_start_that_failed_are_retried() -> None:
    from ray.train import ControllerError

    node = describe_failure(lost({0: died(message="its node has died")}), FailureConfig())
    assert node is not None and node.cause == "node" and node.what == "worker 0 was lost with its node"
    start = describe_failure(ControllerError(TimeoutError("workers did not start")), FailureConfig())
    assert start is not None and start.cause == "start" and start.retryable


def test_a_rayft_error_a_worker_raised_is_raised_as_it_is_and_never_retried(tmp_path: Path) -> None:
    error = DataError("data.datasets.0: row 3 is not valid JSON; fix the file")
    store = open_store(RunLocation(tmp_path, None))
    with pytest.raises(DataError, match="row 3 is not valid JSON") as raised:
        decide_after_failure(lost({1: RuntimeError("x"), 0: error}), FailureConfig(max_failures=3), store, restarts=0)
    assert raised.value is error


def test_an_interrupt_or_a_driver_error_is_no_failure_of_the_run(tmp_path: Path) -> None:
    store = open_store(RunLocation(tmp_path, None))
    with pytest.raises(ValueError, match="driver"):
        decide_after_failure(ValueError("driver"), FailureConfig(), store, restarts=0)


def write_progress(run_dir: Path, steps: int, checkpoints: list[int]) -> None:
    """metrics.jsonl up to ``steps`` and complete checkpoints of ``checkpoints``, as a run leaves them."""
    records = [json.dumps({"step": s, "train/loss": 1.0 / s}) for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("\n".join(records) + "\n")
    for step in checkpoints:
        directory = run_dir / "checkpoints" / f"step-{step:06d}"
        directory.mkdir(parents=True)
        (directory / "weights.bin").write_bytes(b"w")
        write_manifest(directory, step)


def test_a_restart_prints_one_line_and_the_last_allowed_ends_with_the_resume_paragraph(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ray.exceptions import OutOfMemoryError

    write_progress(tmp_path, steps=60, checkpoints=[40, 50])
    store, config = open_store(RunLocation(tmp_path, None)), FailureConfig(max_failures=2)
    caplog.set_level("INFO", logger="rayft.train")
    decide_after_failure(lost({1: died()}), config, store, restarts=1)  # the second restart of two: allowed
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "worker 1 died (killed by a signal, or the process crashed) on node 10.0.0.7 after step 60; restarting "
        "the workers from checkpoint step 50 (attempt 2 of 2)"
    ]
    traceback = [r for r in caplog.records if r.levelname == "INFO" and r.exc_info]
    assert len(traceback) == 1 and getattr(traceback[0], "rayft_file_only", False), "Ray's report: log file only"

    with pytest.raises(WorkersLostError) as raised:
        decide_after_failure(OutOfMemoryError(OOM_REPORT), config, store, restarts=2)
    error = raised.value
    assert error.checkpoint_step == 50
    assert error.paragraph("rayft train cfg.yaml --resume") == (
        "The Ray Train controller was killed by Ray's memory monitor: node memory 37% (8.67GB of 23.54GB) > "
        "threshold 36.8% on node 192.0.2.2 after step 60, after 2 restart(s) (failure.max_failures=2).\n"
        "The last checkpoint is step 50; continue from it with:\n    rayft train cfg.yaml --resume\n"
        "To use less memory: lower train.micro_batch_size (raising train.gradient_accumulation_steps keeps the "
        "batch), run fewer scaling.num_workers per node, prefer train.method=lora, or free the node of other "
        "processes; Ray kills workers above RAY_memory_usage_threshold of the node's memory (0.95 by default)."
    )


def test_an_error_that_repeats_past_the_retries_ends_as_a_training_error_naming_rank_and_error(
    tmp_path: Path,
) -> None:
    store = open_store(RunLocation(tmp_path, None))
    failure = lost({1: RuntimeError("injected failure on rank 1 at step 3")})
    decide_after_failure(failure, FailureConfig(max_failures=1), store, restarts=0)
    with pytest.raises(TrainingError, match=r"training failed on rank 1 after 1 restart\(s\).*RuntimeError") as raised:
        decide_after_failure(failure, FailureConfig(max_failures=1), store, restarts=1)
    assert not isinstance(raised.value, WorkersLostError)


def test_callbacks_are_named_as_text_or_with_options_and_a_bad_one_is_refused_in_one_line() -> None:
    cfg = load_config(
        None, ['train.callbacks=["tests.support.faults:FaultInjector", {target: "a.b:C", options: {x: 1}}]']
    )
    assert cfg.train.callbacks == [
        CallbackConfig(target="tests.support.faults:FaultInjector"),
        CallbackConfig(target="a.b:C", options={"x": 1}),
    ]
    with pytest.raises(ConfigError, match=r"train.callbacks.0.target.*'package.module:ClassName'"):
        load_config(None, ["train.callbacks=[just_a_module]"])
    with pytest.raises(ConfigError, match=r"^train.callbacks.1: cannot import 'no_such_package.mod:Thing' on this"):
        load_callbacks([CallbackConfig(target="tests.support.faults:FaultInjector"),
                        CallbackConfig(target="no_such_package.mod:Thing")])  # fmt: skip
    with pytest.raises(ConfigError, match=r"train.callbacks.0: .*AllocateUntilKilled does not take the options"):
        load_callbacks([CallbackConfig(target="tests.support.faults:AllocateUntilKilled", options={"nope": 1})])


def test_only_the_hooks_a_callback_has_are_called() -> None:
    seen: list[tuple[str, int]] = []

    class EndsOnly:
        def on_step_end(self, info: StepInfo) -> None:
            seen.append(("end", info.step))

    callbacks = load_callbacks([])
    assert not callbacks
    from rayft.training.loop.callbacks import Callbacks

    callbacks = Callbacks([EndsOnly()])
    assert callbacks.wants("on_step_end") and not callbacks.wants("on_step_begin")
    callbacks.call("on_step_begin", StepInfo(0, 1, "", step=1))
    callbacks.call("on_step_end", StepInfo(0, 1, "", step=1))
    assert seen == [("end", 1)]
