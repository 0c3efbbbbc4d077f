"""The settings of a Ray that rayft starts itself."""

from __future__ import annotations

from rayft.runtime import LOCAL_RAY_SYSTEM_CONFIG, local_system_config


def test_a_local_ray_runs_its_workers_at_normal_priority() -> None:
    assert local_system_config({})["worker_niceness"] == 0


def test_a_setting_the_user_exported_is_left_to_ray() -> None:
    config = local_system_config({"RAY_worker_niceness": "15"})
    assert "worker_niceness" not in config
    assert set(config) == set(LOCAL_RAY_SYSTEM_CONFIG) - {"worker_niceness"}
