"""The runtime of a Ray that rayft starts itself: the environment, the workers' idle main thread
(its Ray internals are tested in test_ray_private.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rayft.runtime import IDLE_MAIN_THREAD_ENV, environment, local_idle_main_thread


def test_the_train_environment_is_restored_afterwards() -> None:
    os.environ.pop("RAYFT_TEST_SET", None)
    os.environ["RAYFT_TEST_KEPT"] = "before"
    try:
        with environment({"RAYFT_TEST_SET": "1", "RAYFT_TEST_KEPT": "during"}):
            assert os.environ["RAYFT_TEST_SET"] == "1" and os.environ["RAYFT_TEST_KEPT"] == "during"
        assert "RAYFT_TEST_SET" not in os.environ and os.environ["RAYFT_TEST_KEPT"] == "before"
    finally:
        os.environ.pop("RAYFT_TEST_KEPT", None)


IDLE_MAIN_THREAD_CHECK = """
import os, threading
from rayft.training.loop.entry import idle_main_thread

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


def test_a_joined_gcs_is_named_to_the_jobs_processes_except_in_a_ray_job() -> None:
    from rayft.runtime import WORKER_RUNTIME_ENV, join_runtime_env

    joined = join_runtime_env("127.0.0.1:6379", {})
    assert joined == {**WORKER_RUNTIME_ENV, "env_vars": {"RAY_ADDRESS": "127.0.0.1:6379"}}
    # A Ray Client address is not a GCS: Ray's own actors run inside the cluster, not through it.
    assert join_runtime_env("ray://head:10001", {}) == WORKER_RUNTIME_ENV
    # A Ray Job's driver: its submission's environment variables stay as they were.
    assert join_runtime_env("127.0.0.1:6379", {"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"}) == WORKER_RUNTIME_ENV
