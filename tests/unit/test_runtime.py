"""The settings of a Ray that rayft starts itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rayft.runtime import (
    IDLE_MAIN_THREAD_ENV,
    LOCAL_RAY_PROCESS_ENV,
    LOCAL_RAY_SYSTEM_CONFIG,
    LOCAL_RAY_TRAIN_ENV,
    environment,
    local_idle_main_thread,
    local_process_env,
    local_system_config,
    local_train_env,
)


def test_a_local_ray_runs_its_workers_at_normal_priority() -> None:
    assert local_system_config({})["worker_niceness"] == 0


def test_a_setting_the_user_exported_is_left_to_ray() -> None:
    config = local_system_config({"RAY_worker_niceness": "15"})
    assert "worker_niceness" not in config
    assert set(config) == set(LOCAL_RAY_SYSTEM_CONFIG) - {"worker_niceness"}


def test_a_local_ray_runs_training_without_a_preemption_watcher() -> None:
    assert local_train_env({}) == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"} == LOCAL_RAY_TRAIN_ENV


def test_a_train_variable_the_user_exported_is_left_to_ray() -> None:
    assert local_train_env({"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}) == {}


def test_a_local_rays_log_monitor_looks_for_new_files_twice_a_second_unless_exported() -> None:
    assert local_process_env({}) == {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"} == LOCAL_RAY_PROCESS_ENV
    assert local_process_env({"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "1000"}) == {}


def test_the_train_environment_is_restored_afterwards() -> None:
    os.environ.pop("RAYFT_TEST_SET", None)
    os.environ["RAYFT_TEST_KEPT"] = "before"
    try:
        with environment({"RAYFT_TEST_SET": "1", "RAYFT_TEST_KEPT": "during"}):
            assert os.environ["RAYFT_TEST_SET"] == "1" and os.environ["RAYFT_TEST_KEPT"] == "during"
        assert "RAYFT_TEST_SET" not in os.environ and os.environ["RAYFT_TEST_KEPT"] == "before"
    finally:
        os.environ.pop("RAYFT_TEST_KEPT", None)


def test_a_local_ray_trains_with_a_fixed_policy_that_never_calls_the_autoscaling_coordinator() -> None:
    import asyncio

    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy, ResizeDecision
    from ray.train.v2.api.config import ScalingConfig

    from rayft.training.launcher import local_scaling_policy

    policy = local_scaling_policy(FixedScalingPolicy(ScalingConfig(num_workers=2)))
    assert isinstance(policy, FixedScalingPolicy) and type(policy) is not FixedScalingPolicy
    assert policy.scaling_config.num_workers == 2
    # Ray is not running here: any call to the coordinator would fail to create it.
    policy.after_controller_start(None)
    assert policy.make_decision_for_non_running_worker_group() == ResizeDecision(
        num_workers=2, resources_per_worker={"CPU": 1.0}
    )
    asyncio.run(policy.before_controller_shutdown())
    policy.before_controller_abort()


def test_other_scaling_policies_are_left_as_they_are() -> None:
    from rayft.training.launcher import local_scaling_policy

    sentinel = object()
    assert local_scaling_policy(sentinel) is sentinel


class _Source:
    """A dataset's source operator whose blocks are known (as ``from_arrow``'s are)."""

    def __init__(self, bundles: list[str] | None) -> None:
        self._bundles = bundles

    def output_data(self) -> list[str] | None:
        return self._bundles


class _Dataset:
    """The parts of a Ray Data dataset the block iterator reads."""

    def __init__(self, bundles: list[str] | None) -> None:
        self._logical_plan = type("Plan", (), {"dag": _Source(bundles)})()

    def _execute_to_iterator(self) -> tuple[str, str, str]:
        return "executed", "stats", "executor"


def test_in_memory_shards_are_iterated_without_an_executor_or_stats() -> None:
    from rayft.training.launcher import block_iterator_class

    iterator_class = block_iterator_class()
    assert iterator_class is not None
    bundles, stats, executor = iterator_class(_Dataset(["block-0", "block-1"]))._to_ref_bundle_iterator()
    assert list(bundles) == ["block-0", "block-1"] and stats is None and executor is None
    # A dataset whose blocks are not known yet is executed as usual.
    assert iterator_class(_Dataset(None))._to_ref_bundle_iterator() == ("executed", "stats", "executor")


IDLE_MAIN_THREAD_CHECK = """
import os, threading
from rayft.training.launcher import idle_main_thread

assert not idle_main_thread()  # called on the main thread itself: left alone
assert os.sched_getscheduler(0) != os.SCHED_IDLE
seen = []

def training_thread():
    seen.append(idle_main_thread())
    seen.append(os.sched_getscheduler(0) == os.SCHED_IDLE)
    started = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0) == os.SCHED_IDLE))
    started.start()
    started.join()

thread = threading.Thread(target=training_thread)
thread.start()
thread.join()
print("changed", seen[0], "main idle", os.sched_getscheduler(0) == os.SCHED_IDLE, "others idle", seen[1:])
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_training_thread_puts_only_the_main_thread_at_idle_priority() -> None:
    # In a child process: the main thread of the test run itself must keep its priority.
    done = subprocess.run([sys.executable, "-c", IDLE_MAIN_THREAD_CHECK], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["changed", "True", "main", "idle", "True", "others", "idle", "[False,", "False]"]


def test_the_main_thread_goes_idle_unless_exported_as_0() -> None:
    assert local_idle_main_thread({})
    assert local_idle_main_thread({IDLE_MAIN_THREAD_ENV: "1"})
    assert not local_idle_main_thread({IDLE_MAIN_THREAD_ENV: "0"})
