"""The settings of a Ray that rayft starts itself."""

from __future__ import annotations

import os

from rayft.runtime import LOCAL_RAY_SYSTEM_CONFIG, LOCAL_RAY_TRAIN_ENV, local_system_config, local_train_env
from rayft.training.launcher import environment


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


def test_the_train_environment_is_restored_afterwards() -> None:
    os.environ.pop("RAYFT_TEST_SET", None)
    os.environ["RAYFT_TEST_KEPT"] = "before"
    try:
        with environment({"RAYFT_TEST_SET": "1", "RAYFT_TEST_KEPT": "during"}):
            assert os.environ["RAYFT_TEST_SET"] == "1" and os.environ["RAYFT_TEST_KEPT"] == "during"
        assert "RAYFT_TEST_SET" not in os.environ and os.environ["RAYFT_TEST_KEPT"] == "before"
    finally:
        os.environ.pop("RAYFT_TEST_KEPT", None)
