"""The Ray internals rayft relies on (rayft._ray_private): a canary that resolves every one of them in
the installed Ray, what each private path does, and Ray's public default with the switch off."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from rayft import _ray_private
from rayft._ray_private import (
    LOCAL_RAY_PROCESS_ENV,
    LOCAL_RAY_SYSTEM_CONFIG,
    LOCAL_RAY_TRAIN_ENV,
    PRIVATE_SYMBOLS,
    SWITCH_ENV,
    lean_head,
    local_init_kwargs,
    local_process_env,
    local_scaling_policy,
    local_system_config,
    local_train_env,
    missing_torch_steps,
    resolve,
    run_torch_step,
    torch_backend_class,
    torch_config,
    trainer_class,
)

OFF = {SWITCH_ENV: "0"}


@pytest.mark.parametrize("symbol", PRIVATE_SYMBOLS)
def test_every_private_ray_name_exists_in_the_installed_ray(symbol: str) -> None:
    assert resolve(symbol) is not None, symbol


def test_the_private_names_are_used_as_this_ray_defines_them() -> None:
    import ray
    from ray.train.v2._internal.constants import ENABLE_PREEMPTION_WATCHER_ENV_VAR, HEALTH_CHECK_INTERVAL_S_ENV_VAR

    assert 'kwargs.pop("_system_config"' in inspect.getsource(ray.init)
    assert set(LOCAL_RAY_TRAIN_ENV) == {ENABLE_PREEMPTION_WATCHER_ENV_VAR, HEALTH_CHECK_INTERVAL_S_ENV_VAR}
    trainer_source = inspect.getsource(resolve("ray.train.v2.api.data_parallel_trainer:DataParallelTrainer.fit"))
    assert "scaling_policy=" in trainer_source and "_create_default_callbacks()" in trainer_source


def test_the_installed_ray_is_the_series_checked_and_pinned() -> None:
    import ray

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("ray[")]
    assert pins == [f"ray[default,train,data,tune,serve]~={_ray_private.CHECKED_RAY_SERIES}.0"]
    assert ray.__version__.startswith(f"{_ray_private.CHECKED_RAY_SERIES}."), (
        f"Ray {ray.__version__} is installed, but rayft's Ray internals were checked against "
        f"{_ray_private.CHECKED_RAY_SERIES}.x (see docs/development.md: checking a newer Ray)"
    )


def test_a_local_ray_runs_lean_unless_the_user_exported_a_setting() -> None:
    assert local_system_config({})["worker_niceness"] == 0
    config = local_system_config({"RAY_worker_niceness": "15"})
    assert set(config) == set(LOCAL_RAY_SYSTEM_CONFIG) - {"worker_niceness"}
    assert local_init_kwargs({}) == {"_system_config": LOCAL_RAY_SYSTEM_CONFIG}
    train_env = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    assert local_train_env({}) == train_env == LOCAL_RAY_TRAIN_ENV
    assert local_train_env({"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}) == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    assert local_process_env({}) == {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"} == LOCAL_RAY_PROCESS_ENV
    assert local_process_env({"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "1000"}) == {}


def test_a_local_ray_trains_with_a_fixed_policy_that_never_calls_the_autoscaling_coordinator() -> None:
    import asyncio

    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy, ResizeDecision
    from ray.train.v2.api.config import ScalingConfig

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
    sentinel = object()
    assert local_scaling_policy(sentinel) is sentinel  # any other policy is left as it is


def test_a_local_ray_trains_without_the_cleaner_and_the_coordinator() -> None:
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    local = trainer_class(own_ray=True)
    assert issubclass(local, DataParallelTrainer) and not issubclass(local, TorchTrainer)
    assert trainer_class(own_ray=False) is TorchTrainer  # a joined cluster keeps Ray's defaults


def test_a_local_trainer_without_datasets_starts_no_dataset_manager() -> None:
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    def kinds(trainer: object) -> set[type]:
        return {type(c) for c in trainer._create_default_callbacks()}  # type: ignore[attr-defined]

    local, public = trainer_class(own_ray=True), trainer_class(own_ray=False)
    config = torch_config("gloo", 60, deferred=True)
    assert {DatasetsCallback, PlacementGroupCleanerCallback} <= kinds(public(train_loop_per_worker=lambda: None))
    assert not {DatasetsCallback, PlacementGroupCleanerCallback} & kinds(
        local(train_loop_per_worker=lambda: None, torch_config=config)
    )
    # Given a dataset (a callable that makes it), the local trainer keeps the callback that shards it.
    with_data = local(train_loop_per_worker=lambda: None, torch_config=config, datasets={"train": lambda: None})
    assert DatasetsCallback in kinds(with_data) and PlacementGroupCleanerCallback not in kinds(with_data)


# What the driver of a run on a local Ray sends Ray Train's controller and workers, pickled as Ray pickles
# it, built in a fresh interpreter (this one has torch loaded), then unpickled as the controller would.
DRIVER_WITHOUT_TORCH = """
import pickle, sys
from ray import cloudpickle
from rayft._ray_private import torch_config, trainer_class
trainer = trainer_class(own_ray=True)(lambda config: None, torch_config=torch_config("gloo", 60, deferred=True))
blob = cloudpickle.dumps((trainer.train_run_context, trainer._create_default_callbacks(), trainer._get_train_func()))
print("torch imported by the driver:", "torch" in sys.modules)
context, callbacks, train_fn = pickle.loads(blob)
config = context.backend_config
backends = [c._backend for c in callbacks if hasattr(c, "_backend")]
print("controller's config:", config.backend, config.timeout_s, config.framework.name, config.to_dict())
print("controller's backends:", len(backends), all(isinstance(b, config.backend_cls) for b in backends),
      all(b.share_cuda_visible_devices for b in backends))
print("torch imported by the controller:", "torch" in sys.modules)
"""


def test_neither_the_driver_nor_the_controller_of_a_local_run_imports_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_WITHOUT_TORCH], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch imported by the driver: False" in done.stdout, done.stdout
    expected = "controller's config: gloo 60 TORCH {'backend': 'gloo', 'init_method': 'env', 'timeout_s': 60}"
    assert expected in done.stdout, done.stdout
    assert "controller's backends: 2 True True" in done.stdout, done.stdout  # the accelerator and backend callbacks
    assert "torch imported by the controller: False" in done.stdout, done.stdout


def test_the_workers_run_rays_own_torch_set_up_sent_by_name() -> None:
    from ray.train._internal.utils import get_address_and_port
    from ray.train.torch import config as ray_torch

    assert missing_torch_steps() == []  # else the lean backend hands over to Ray's (see torch_config)
    assert run_torch_step("ray.train._internal.utils:get_address_and_port").__class__ is tuple
    assert get_address_and_port is resolve("ray.train._internal.utils:get_address_and_port")
    assert ray_torch._shutdown_torch is resolve("ray.train.torch.config:_shutdown_torch")
    run_torch_step("ray.train.torch.config:_shutdown_torch", destroy_process_group=False)  # no group here: a no-op


def test_a_worker_runs_the_training_function_in_rays_torch_context() -> None:
    from ray.train.torch.config import TorchConfigContextManager

    entered: list[str] = []

    class Recording(TorchConfigContextManager):  # type: ignore[misc]
        def __enter__(self) -> None:
            entered.append("in")

        def __exit__(self, *exc: object) -> None:
            entered.append("out")

    config = torch_config("gloo", 60, deferred=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ray.train.torch.config.TorchConfigContextManager", Recording)
        with config.train_func_context():
            assert entered == ["in"]
    assert entered == ["in", "out"]
    assert config.backend == "gloo" and torch_config("gloo", 60, deferred=False).backend_cls is torch_backend_class()


def test_a_lean_head_skips_the_monitor_and_if_asked_the_dashboard_only_while_ray_starts() -> None:
    from ray._private.node import Node

    monitor, api_server = Node.start_monitor, Node.start_api_server
    with lean_head({}):
        assert Node.start_monitor is not monitor and Node.start_api_server is api_server
        assert Node.start_monitor(object()) is None  # type: ignore[arg-type]
    assert Node.start_monitor is monitor
    with pytest.raises(RuntimeError), lean_head({}):
        raise RuntimeError("ray.init failed")
    assert Node.start_monitor is monitor
    # The Ray of one rayft command, which no driver joins, starts without the dashboard's head too.
    with lean_head({}, joinable=False):
        assert Node.start_monitor is not monitor and Node.start_api_server is not api_server
        assert Node.start_api_server(object(), include_dashboard=False, raise_on_failure=True) is None  # type: ignore[arg-type]
    assert (Node.start_monitor, Node.start_api_server) == (monitor, api_server)


def test_switched_off_every_path_is_rays_public_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private.node import Node
    from ray.train.torch import TorchTrainer

    monitor, api_server = Node.start_monitor, Node.start_api_server
    with lean_head(OFF, joinable=False):
        assert (Node.start_monitor, Node.start_api_server) == (monitor, api_server)

    assert local_system_config(OFF) == {} and local_init_kwargs(OFF) == {}
    assert local_process_env(OFF) == {} and local_train_env(OFF) == {}
    monkeypatch.setenv(SWITCH_ENV, "0")
    assert trainer_class(own_ray=True) is TorchTrainer


def test_a_private_name_this_ray_lacks_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rayft._ray_private"):
        assert _ray_private._load("ray.train.v2._internal.nowhere:Thing") is None
        assert _ray_private._load("ray.train.torch:TorchTrainer._no_such_method") is None
    assert len(caplog.records) == 2
    assert "has no ray.train.v2._internal.nowhere:Thing" in caplog.records[0].getMessage()
    assert f"install ray~=2.60.0, or export {SWITCH_ENV}=0" in caplog.records[1].getMessage()
