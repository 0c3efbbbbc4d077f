"""Every Ray internal that rayft relies on, in this one module, behind one switch.

On a Ray that rayft started itself (:func:`rayft.runtime.owns_ray`: one machine, no dashboard, gone
when the command ends) rayft drops services that only a shared, long-lived cluster needs, and that
cost start-up time and CPU beside training on a small machine. Doing so reaches into Ray: private
modules and classes, private methods overridden, ``ray.init``'s private ``_system_config``, and
settings that Ray reads from its internal environment variables. Each of them was checked against
the Ray series :data:`CHECKED_RAY_SERIES`, which ``pyproject.toml`` pins.

- ``RAYFT_RAY_PRIVATE=0`` (:data:`SWITCH_ENV`) turns every one of them off: rayft then uses Ray's
  public API only, as on a cluster it joined. Runs give the same results; they start slower and run
  a few more processes beside the workers.
- ``tests/unit/test_ray_private.py`` resolves every name in :data:`PRIVATE_SYMBOLS`, so that a Ray
  that moved one fails there, loudly. At run time a name that is missing is logged as a warning and
  only that path falls back to Ray's default.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rayft.security import redact

log = logging.getLogger(__name__)

SWITCH_ENV = "RAYFT_RAY_PRIVATE"
CHECKED_RAY_SERIES = "2.60"

_WORKER_GROUP_STATE = "ray.train.v2._internal.execution.worker_group.worker_group:WorkerGroup.get_worker_group_state"
_RESTORE_FROM_REMOTE = "ray.tune.logger.logger:LoggerCallback._restore_from_remote"
_ENTRYPOINT_NAME = "ray._private.utils:get_entrypoint_name"
_DATASETS_CALLBACK = "ray.train.v2._internal.callbacks.datasets:DatasetsCallback"
_PLACEMENT_GROUP_TABLE = "ray._private.state:state._connect_and_get_accessor"
_ACTOR_TABLE = "ray._private.state:actors"
_TORCH_BACKEND = "ray.train.torch.config:_TorchBackend"
_TORCH_CONTEXT = "ray.train.torch.config:TorchConfigContextManager"
_PRINT_TO_STDSTREAM = "ray._private.worker:print_to_stdstream"
_DATA_PARALLEL_TRAINER = "ray.train.v2.api.data_parallel_trainer:DataParallelTrainer"
_START_MONITOR = "ray._private.node:Node.start_monitor"
_START_API_SERVER = "ray._private.node:Node.start_api_server"
_TRAINING_FRAMEWORK = "ray.train.v2._internal.util:TrainingFramework"
# Ray's worker-side torch set-up, which the lean backend sends to the workers by name (the module
# imports torch: only a worker loads it).
_ADDRESS_AND_PORT = "ray.train._internal.utils:get_address_and_port"
_TORCH_ENV_VARS = "ray.train.torch.config:_set_torch_distributed_env_vars"
_TORCH_PROCESS_GROUP = "ray.train.torch.config:_setup_torch_process_group"
_TORCH_SHUTDOWN = "ray.train.torch.config:_shutdown_torch"
_TORCH_WORKER_STEPS = (_ADDRESS_AND_PORT, _TORCH_ENV_VARS, _TORCH_PROCESS_GROUP, _TORCH_SHUTDOWN)

# Every private name used below, as "module:attribute.path" (the canary test resolves each).
PRIVATE_SYMBOLS: tuple[str, ...] = (
    "ray:init",  # its private keyword argument _system_config (checked apart)
    "ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback",
    _DATASETS_CALLBACK,
    _DATA_PARALLEL_TRAINER,
    f"{_DATA_PARALLEL_TRAINER}._create_default_callbacks",
    f"{_DATA_PARALLEL_TRAINER}._initialize_and_run_controller",
    _TORCH_CONTEXT,
    "ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy",
    "ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy._maybe_send_resource_request",
    "ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy.after_controller_start",
    "ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy.before_controller_shutdown",
    "ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy.before_controller_abort",
    "ray._private.log_monitor:RAY_LOG_MONITOR_MANY_FILES_THRESHOLD",
    "ray.train.v2._internal.constants:ENABLE_PREEMPTION_WATCHER_ENV_VAR",
    "ray.train.v2._internal.execution.callback:WorkerGroupCallback",
    _WORKER_GROUP_STATE,
    _RESTORE_FROM_REMOTE,
    _ENTRYPOINT_NAME,
    _PLACEMENT_GROUP_TABLE,
    _ACTOR_TABLE,
    _TORCH_BACKEND,
    "ray.train.torch:TorchConfig.backend_cls",
    _PRINT_TO_STDSTREAM,
    _START_MONITOR,
    _START_API_SERVER,
    _TRAINING_FRAMEWORK,
    *_TORCH_WORKER_STEPS,
)

# Ray settings of a Ray that rayft starts itself (never of a cluster it joins), passed as
# ray.init's _system_config. Each one can be set back by exporting it as ``RAY_<name>`` before
# running rayft; an exported one wins.
LOCAL_RAY_SYSTEM_CONFIG: dict[str, object] = {
    # Ray starts its worker processes (the training workers among them) at nice 15, below every
    # ordinary process on the machine, so that a busy worker cannot starve the raylet of a shared
    # cluster node. On a machine of one's own this only lets every other process (the raylet, the
    # driver, an editor, a test run) preempt the training loop; torchrun workers run at nice 0.
    "worker_niceness": 0,
    # Every Ray process records and exports metrics for a Prometheus/dashboard that a local rayft
    # Ray does not start (include_dashboard=False), and reports task events (for `ray list tasks`)
    # every second. On a laptop whose cores all train, those wake-ups come out of training.
    "enable_metrics_collection": False,
    "task_events_report_interval_ms": 10_000,
    # The raylet starts one idle Python worker per CPU when it starts, and more when the first driver
    # connects, for tasks that may come. rayft's actors (Ray Train's controller and workers, each
    # with environment variables of its own) cannot take them, so each stays idle to the end: 0.6-1 s
    # of CPU each per command (2-4 on 2 CPUs), while a task's worker starts when it is needed.
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}

# Environment variables of the processes a Ray that rayft starts runs beside its workers (read by
# those processes, which inherit them from this one when ray.init starts them); an exported one wins.
LOCAL_RAY_PROCESS_ENV: dict[str, str] = {
    # Ray's log monitor, which forwards the workers' output to this console, looks for new log files
    # with five globs over the log directory ten times a second, unless it already follows many
    # files; then it looks every half second (LOG_NAME_UPDATE_INTERVAL_S). Looking every half second
    # from the start halves its CPU beside training. A new file is still read from its first line.
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
}

# Ray Train settings (environment variables the driver passes on to Ray Train's controller and
# workers) for runs on a Ray that rayft starts itself; an exported one wins.
LOCAL_RAY_TRAIN_ENV: dict[str, str] = {
    # The preemption watcher is an extra actor process that polls for node drains every 5 s and
    # starts just as training does. A local Ray that lives and dies with one rayft command is never
    # drained by an autoscaler, so there is nothing for it to watch.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # The controller looks at its workers every 2 s: it consumes a reported checkpoint, and notices
    # that the workers finished, up to 2 s late, and the end of a run waits on several such looks
    # (6-7 s from the last step until fit() returns, for a tiny 6-step run on 2 CPUs). Looking twice
    # a second, a few small actor calls, ends every run about 5 s sooner (1.3-1.4 s measured).
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether rayft may use Ray's internals (on unless :data:`SWITCH_ENV` is exported as ``0``)."""
    environ = os.environ if environ is None else environ
    return environ.get(SWITCH_ENV, "1").strip() != "0"


def resolve(symbol: str) -> Any:
    """The object a ``"module:attribute.path"`` of :data:`PRIVATE_SYMBOLS` names; raises
    ImportError or AttributeError where this Ray has no such thing."""
    module_name, _, path = symbol.partition(":")
    value: Any = importlib.import_module(module_name)
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _load(symbol: str) -> Any:
    """:func:`resolve`, or None with a warning that names the fix (the caller takes Ray's default)."""
    try:
        return resolve(symbol)
    except (ImportError, AttributeError) as exc:
        import ray

        log.warning(
            "Ray %s has no %s (%s: %s); rayft uses Ray's default there. Its lean local runtime was checked "
            "against Ray %s.x: install ray~=%s.0, or export %s=0 to use Ray's public API throughout.",
            ray.__version__, symbol, type(exc).__name__, exc, CHECKED_RAY_SERIES, CHECKED_RAY_SERIES, SWITCH_ENV,
        )  # fmt: skip
        return None


def local_system_config(environ: Mapping[str, str], *, metrics: bool = False) -> dict[str, object]:
    """The Ray system config of a local Ray started by rayft: :data:`LOCAL_RAY_SYSTEM_CONFIG`, less
    the settings the user exported as ``RAY_<name>`` (Ray reads those itself); none when off. With
    ``metrics`` (``logging.prometheus``), Ray's metrics collection stays on for the training metrics."""
    if not enabled(environ):
        return {}
    config = {name: value for name, value in LOCAL_RAY_SYSTEM_CONFIG.items() if f"RAY_{name}" not in environ}
    if metrics:
        config.pop("enable_metrics_collection", None)
    return config


def local_init_kwargs(environ: Mapping[str, str], *, metrics: bool = False) -> dict[str, Any]:
    """The private keyword arguments of ``ray.init`` for a local Ray that rayft starts (``metrics``:
    keep Ray's metrics collection on)."""
    config = local_system_config(environ, metrics=metrics)
    return {"_system_config": config} if config else {}


def local_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of the processes a Ray that rayft starts runs beside its workers:
    :data:`LOCAL_RAY_PROCESS_ENV`, less the variables the user exported; none when off."""
    if not enabled(environ):
        return {}
    return {name: value for name, value in LOCAL_RAY_PROCESS_ENV.items() if name not in environ}


@contextlib.contextmanager
def lean_head(environ: Mapping[str, str] | None = None, *, joinable: bool = True) -> Iterator[None]:
    """While a local Ray starts (around ``ray.init``), its head does not start the autoscaler's
    monitor, nor, unless ``joinable``, the dashboard's head process; Ray's own head when off.

    The monitor runs the autoscaler, of which a Ray that lives and dies with one rayft command on
    one machine has none, and the reports ``ray status`` reads: a Python process importing Ray
    beside training, 0.6-0.8 s of CPU for a `rayft train` of eight tiny steps on 2 cores.

    Ray starts the dashboard's head even without the dashboard (``include_dashboard=False``), with
    none of its APIs (State, Jobs, Serve), to send usage statistics. Only a driver that joins this
    Ray needs it: Ray Train's placement-group cleaner there asks it for the State API's address,
    and without it cannot stop within its timeout (a traceback at the end of every such run). A
    ``joinable`` Ray (the tests' shared one, which their drivers join) keeps it; the Ray of one
    rayft command, which nothing joins, starts without it: measured on 2 cores, ``ray.init``
    took 2.8-3.7 s instead of 4.0-5.6 s and its processes 5.2-5.8 CPU-s instead of 5.6-8.0.
    """
    if not enabled(environ):
        yield
        return
    from ray._private.node import Node

    def skipped(self: Any, **_: Any) -> None:
        """Not started: see :func:`lean_head`."""

    symbols = (_START_MONITOR,) if joinable else (_START_MONITOR, _START_API_SERVER)
    loaded = {symbol.rsplit(".", 1)[1]: _load(symbol) for symbol in symbols}  # Node's method name: Ray's own
    originals = {name: method for name, method in loaded.items() if method is not None}
    for name in originals:
        setattr(Node, name, skipped)  # patched for the start only, restored below
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(Node, name, method)


def local_train_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The Ray Train environment of a run on a Ray that rayft started: :data:`LOCAL_RAY_TRAIN_ENV`,
    less the variables the user exported; none when off."""
    if not enabled(environ):
        return {}
    return {name: value for name, value in LOCAL_RAY_TRAIN_ENV.items() if name not in environ}


def trainer_class(own_ray: bool) -> type:
    """Ray Train's ``TorchTrainer``; on a Ray that rayft started (and with the switch on), one
    without the placement-group cleaner and without registering its workers with Ray Data's
    autoscaling coordinator.

    That cleaner is a detached actor that asks the State API every second whether the controller
    is still alive, to remove its placement group if it died. The State API needs the dashboard,
    which a local rayft Ray does not run: every check fails (a warning each second in the run's
    log), so it could never clean anything, while its process costs CPU beside training. On a
    Ray that rayft started, the placement groups end with the command anyway.

    The coordinator is a detached actor through which Ray Train and Ray Data ask an autoscaler for
    nodes and share out what a cluster has. The controller creates it and waits for its process to
    start before it starts any worker (over a second of start-up on a small machine), and it then
    lives beside training. A local Ray has no autoscaler and no nodes to add, and the workers run
    no Ray Data (each reads its rows of the prepared files itself).

    For the same reason a trainer given no datasets (rayft's never is) drops Ray Train's datasets
    callback: it starts a dataset-manager actor for every run all the same, one more process that
    imports Ray Data (over a second of CPU here) only to hand out shards nobody asks for.

    It is built on Ray Train's ``DataParallelTrainer``, to which ``TorchTrainer`` adds a default
    ``TorchConfig`` and Ray Train's local mode for zero workers (which rayft, training in its own
    process then, never asks for), and takes the deferred config of :func:`torch_config`: the
    driver imports no torch (see there).
    """
    if not (own_ray and enabled()):
        from ray.train.torch import TorchTrainer

        return TorchTrainer
    base = _load(_DATA_PARALLEL_TRAINER)
    overridden = ("_create_default_callbacks", "_initialize_and_run_controller")
    if base is None or any(_load(f"{_DATA_PARALLEL_TRAINER}.{name}") is None for name in overridden):
        from ray.train.torch import TorchTrainer

        return TorchTrainer
    cleaner = _load("ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback")
    datasets_callback = _load(_DATASETS_CALLBACK)
    dropped: tuple[type, ...] = (cleaner,) if cleaner is not None else ()

    class LocalTorchTrainer(base):  # type: ignore[misc, valid-type]
        """A torch trainer without the placement-group cleaner and the autoscaling coordinator,
        and, given no datasets, without the datasets callback."""

        def __init__(self, train_loop_per_worker: Callable[..., Any], *, torch_config: Any, **kwargs: Any) -> None:
            super().__init__(train_loop_per_worker, backend_config=torch_config, **kwargs)

        def _create_default_callbacks(self) -> list[Any]:
            callbacks: list[Any] = super()._create_default_callbacks()
            drop = dropped
            if datasets_callback is not None and not self.datasets:
                drop = (*dropped, datasets_callback)
            return [c for c in callbacks if not isinstance(c, drop)]

        def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
            if "scaling_policy" in controller_init_kwargs:
                policy = controller_init_kwargs["scaling_policy"]
                controller_init_kwargs["scaling_policy"] = local_scaling_policy(policy)
            return super()._initialize_and_run_controller(**controller_init_kwargs)

    return LocalTorchTrainer


def local_scaling_policy(policy: Any) -> Any:
    """Ray Train's fixed-size scaling ``policy`` less its requests to the autoscaling coordinator;
    any other policy (elastic training) unchanged. The class is defined here, not at module level,
    so that the controller gets the class itself and need not import rayft."""
    fixed = _load("ray.train.v2._internal.execution.scaling_policy:FixedScalingPolicy")
    if fixed is None or type(policy) is not fixed:
        return policy

    class LocalFixedScalingPolicy(fixed):  # type: ignore[misc, valid-type]
        """``FixedScalingPolicy`` that never creates or calls the autoscaling coordinator."""

        def after_controller_start(self, train_run_context: Any) -> None:
            """Nothing to register: no autoscaler, no other requester."""

        async def before_controller_shutdown(self) -> None:
            """No request to cancel."""

        def before_controller_abort(self) -> None:
            """No request to cancel."""

        def _maybe_send_resource_request(self) -> None:
            """No request to renew."""

    return LocalFixedScalingPolicy(policy.scaling_config)


def remove_orphaned_groups() -> list[str]:
    """Remove the placement groups of this job whose creating actor is dead; returns their ids.

    Ray Train's controller reserves its workers' resources with a placement group, which belongs to
    the job: when the controller is killed (Ray's memory monitor picks it as readily as a worker),
    the group outlives it and holds the resources a restart waits for. Ray Train's own cleaner of
    such groups asks the State API, which a Ray without its dashboard does not answer (and which
    :func:`trainer_class` drops on a Ray that rayft started). Reads the placement-group table through
    Ray's private GCS accessor; where this Ray has none, removes nothing. Independent of
    :data:`SWITCH_ENV`: without it, a restart after a killed controller would wait for nothing.
    """
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = []
    for group_id, creator_dead in actor_made_groups().items():
        if creator_dead:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
            removed.append(group_id)
    return removed


def actor_made_groups() -> dict[str, bool]:
    """The placement groups of this job that an actor created and that are not removed, each with
    whether its creating actor is dead (detached groups, and those of an ended job, left out); empty
    where this Ray has no placement-group table accessor."""
    import ray
    from ray.core.generated import gcs_pb2

    accessor, actors = _load(_PLACEMENT_GROUP_TABLE), _load(_ACTOR_TABLE)
    if accessor is None or actors is None:
        return {}
    table: Any = getattr(gcs_pb2, "PlacementGroupTableData")  # noqa: B009 - generated protobuf code, no stubs
    job = ray.get_runtime_context().get_job_id()
    groups = {}
    for raw in accessor().get_placement_group_table():
        group = table.FromString(raw)
        # A group the driver itself created has no creating actor, and Ray says that actor is dead.
        by_actor = len(group.creator_actor_id) == 16 and not ray.ActorID(group.creator_actor_id).is_nil()
        ours = group.creator_job_id.hex() == job and not group.creator_job_dead and not group.is_detached
        if by_actor and ours and group.state != table.REMOVED:
            # The group's own flag stays unset when Tune ends a trial's process by dropping its last
            # handle (Ray 2.60); the actor table says DEAD then.
            dead = group.creator_actor_dead or actors(group.creator_actor_id.hex()).get("State") == "DEAD"
            groups[group.placement_group_id.hex()] = bool(dead)
    return groups


def torch_config(backend: str, timeout_s: int, *, deferred: bool = False) -> Any:
    """Ray Train's ``TorchConfig`` (``backend``: gloo or nccl), whose shutdown of a worker group
    goes on past a worker that is already dead; Ray's own where this Ray's internals differ.

    Ray Train shuts a failed worker group down by first running a task on every worker that ends
    its torch process group, and lets the error of a dead worker's task escape: its shutdown then
    stops there, before it ends the other workers and removes their placement group, and the
    controller logs the traceback: seen with a worker killed by Ray's memory monitor, whose task
    fails with ``OutOfMemoryError``. A dead worker has no process group left to end, so its error
    is dropped, and the shutdown carries on. Independent of :data:`SWITCH_ENV`: without it,
    a restart after a worker that ran out of memory waits for resources nothing frees.

    ``deferred`` (a Ray that rayft started, :data:`SWITCH_ENV` on): a config that neither the driver
    nor Ray Train's controller imports torch for (see :func:`_lean_torch_classes`).
    """
    if deferred and enabled():
        return _lean_torch_classes()[0](backend, timeout_s)
    from ray.train.torch import TorchConfig

    found = torch_backend_class()
    if found is None:
        return TorchConfig(backend=backend, timeout_s=timeout_s)
    backend_class: type = found

    class Config(TorchConfig):
        """``TorchConfig`` with :func:`torch_backend_class`'s backend."""

        @property
        def backend_cls(self) -> type:
            return backend_class

    return Config(backend=backend, timeout_s=timeout_s)


@functools.cache
def torch_backend_class() -> type | None:
    """Ray Train's torch backend whose shutdown skips a dead worker (see :func:`torch_config`); None
    where this Ray has no such backend."""
    from ray.exceptions import RayError

    base = _load(_TORCH_BACKEND)
    if base is None:
        return None

    class TorchBackend(base):  # type: ignore[misc, valid-type]
        """Ray Train's torch backend whose shutdown skips a dead worker."""

        def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
            with contextlib.suppress(RayError):  # a dead worker's task: nothing of its process group is left
                super().on_shutdown(worker_group, backend_config)

    return TorchBackend


@contextlib.contextmanager
def torch_on_worker() -> Iterator[None]:
    """Ray's torch context of a training function (it picks the worker's CUDA device), imported on
    the worker: the lean config's ``train_func_context``."""
    context = _load(_TORCH_CONTEXT)
    with context() if context is not None else contextlib.nullcontext():
        yield


def run_torch_step(symbol: str, *args: Any, **kwargs: Any) -> Any:
    """Call Ray's worker-side torch function ``symbol`` (of :data:`_TORCH_WORKER_STEPS`) on the worker
    that runs this: the lean backend sends this, so that only the worker, which trains with torch,
    imports the module that holds it."""
    return resolve(symbol)(*args, **kwargs)


def missing_torch_steps() -> list[str]:
    """Which of :data:`_TORCH_WORKER_STEPS` this Ray lacks (run on a worker)."""
    missing = []
    for symbol in _TORCH_WORKER_STEPS:
        try:
            resolve(symbol)
        except (ImportError, AttributeError):
            missing.append(symbol)
    return missing


def _set_master(address: str, port: int) -> None:
    """Where every worker finds rank 0's process-group store (``init_method="env://"``)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)


@functools.cache
def _lean_torch_classes() -> tuple[type, type]:
    """The config of :func:`torch_config` with ``deferred`` and its backend, made on first use
    (``import rayft`` imports no Ray).

    Ray's ``TorchConfig`` and its backend live in a module that imports torch, and so does
    ``TorchTrainer``'s: the driver, which only starts the workers (the ``rayft train`` command, each
    Tune trial), and Ray Train's controller, which only tells the workers what to run, each imported
    torch for them alone: 2.8 s of CPU on 2 cores in the driver, and 1.7 s more and 222 MB of
    resident memory in the controller, for every run. This backend does what Ray's does for gloo and nccl with
    ``init_method="env"`` (set each worker's torch environment, point all at rank 0's address,
    start the process group; on shutdown end it, skipping a dead worker, see :func:`torch_config`),
    by sending Ray's own worker-side functions by name (:func:`run_torch_step`). Where this Ray lacks
    one of them, it hands over to Ray's backend (which the controller then imports torch for).
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayError
    from ray.train import constants
    from ray.train.backend import Backend, BackendConfig

    def ray_backend(config: Any) -> tuple[Any, Any]:
        real = torch_config(config.backend, config.timeout_s)
        return real.backend_cls(), real

    class LeanTorchBackend(Backend):
        """Ray Train's torch backend, run by the controller without torch."""

        share_cuda_visible_devices = True  # as Ray's: every worker of a node sees the node's GPUs
        ray_backend: tuple[Any, Any] | None = None  # Ray's backend and config, where this Ray lacks a worker step

        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            if worker_group.execute_single(0, missing_torch_steps):
                self.ray_backend = ray_backend(backend_config)
                self.ray_backend[0].on_start(worker_group, self.ray_backend[1])
                return
            address, port = worker_group.execute_single(0, run_torch_step, _ADDRESS_AND_PORT)
            worker_group.execute(run_torch_step, _TORCH_ENV_VARS)
            worker_group.execute(_set_master, address, port)
            size = len(worker_group)
            options = {"backend": backend_config.backend, "world_size": size, "timeout_s": backend_config.timeout_s}
            starts = [
                worker_group.execute_single_async(
                    rank, run_torch_step, _TORCH_PROCESS_GROUP, world_rank=rank, init_method="env://", **options
                )
                for rank in range(size)
            ]
            ray.get(starts)

        def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
            if self.ray_backend is not None:
                self.ray_backend[0].on_shutdown(worker_group, self.ray_backend[1])
                return
            variable, default = (
                constants.TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                constants.DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            )
            timeout_s = int(os.environ.get(variable, default))  # Ray's setting and default
            whole = len(worker_group) > 1  # as Ray's: a group of one is not destroyed
            try:
                ray.get(
                    worker_group.execute_async(run_torch_step, _TORCH_SHUTDOWN, destroy_process_group=whole),
                    timeout=timeout_s,
                )
            except GetTimeoutError:
                log.warning("the torch process group did not shut down within %d s", timeout_s)
            except RayError:  # a dead worker's task: nothing of its process group is left
                pass

    class LeanTorchConfig(BackendConfig):
        """Ray's ``TorchConfig`` for gloo or nccl, without torch where it is built and read."""

        def __init__(self, backend: str, timeout_s: int) -> None:
            self.backend, self.timeout_s = backend, timeout_s

        @property
        def backend_cls(self) -> type:
            return LeanTorchBackend

        @property
        def train_func_context(self) -> Callable[[], AbstractContextManager[None]]:
            return torch_on_worker

        @property
        def framework(self) -> Any:
            framework = _load(_TRAINING_FRAMEWORK)  # what Ray Train's state export files the run under
            return framework.TORCH if framework is not None else None

        def to_dict(self) -> dict[str, Any]:
            return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}

    return LeanTorchConfig, LeanTorchBackend


GROUPS_DIR = ".placement-groups"
"""In a run directory: one empty file per placement group its workers reserved, named by id
(:func:`placement_group_recorder`), until :func:`remove_recorded_groups` removes the group."""


def remove_recorded_groups(directory: Path) -> int:
    """Remove every placement group recorded in ``directory`` (one already gone is skipped); returns
    how many records were cleared. Removing a group ends the actors still in it."""
    if not directory.is_dir():
        return 0
    cleared = 0
    for record in directory.iterdir():
        with contextlib.suppress(Exception):  # removed already, or a stray file: nothing holds it
            remove_group(record.name)
            log.debug("removed placement group %s recorded in %s", record.name, directory)
        record.unlink(missing_ok=True)
        cleared += 1
    return cleared


def remove_group(group_id: str) -> None:
    """Remove the placement group whose id is ``group_id`` (hex, as Ray prints it)."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))


def placement_group_recorder(directory: str) -> Any:
    """A Ray Train callback that records the placement group of each worker group it starts as an
    empty file named by its id in ``directory``; None where this Ray's internals differ.

    Ray Train removes its workers' placement group when a run ends, and (with its cleaner, which a
    local rayft Ray drops, see :func:`trainer_class`) when its controller dies. Neither happens
    (1) when Ray Train's shutdown of a failed worker group fails before it reaches the group: its
    torch backend first runs a task on every worker and lets the error of a dead one escape, which
    a worker killed by Ray's memory monitor raises, while its controller lives on (on the main
    thread, Ray Train's SIGINT handler holds it) with the group reserved; and (2) when Tune stops
    or pauses a trial, ending its controller. So the launcher removes a failed attempt's recorded
    group before the next one, and a sweep those of its stopped trials (:mod:`rayft.tuning.reaper`).
    Independent of :data:`SWITCH_ENV`: without it, those workers' resources would stay reserved.
    """
    base = _load("ray.train.v2._internal.execution.callback:WorkerGroupCallback")
    if base is None or _load(_WORKER_GROUP_STATE) is None:
        return None

    class PlacementGroupRecorder(base):  # type: ignore[misc, valid-type]
        """Writes ``<directory>/<placement group id>`` once the worker group has started."""

        def __init__(self, directory: str) -> None:
            self._directory = directory

        def after_worker_group_start(self, worker_group: Any) -> None:
            group = worker_group.get_worker_group_state().placement_group_handle.placement_group
            os.makedirs(self._directory, exist_ok=True)
            with open(os.path.join(self._directory, group.id.hex()), "w", encoding="utf-8"):
                pass

    return PlacementGroupRecorder(directory)


def trial_result_loggers() -> list[Any]:
    """Tune's JSON and CSV logger callbacks (a trial's result.json and progress.csv), made to keep
    every report of a trial that Tune pauses and restarts; [] where this Ray's internals differ
    (Tune then adds its own).

    When a trial starts again from a checkpoint, Tune's loggers copy the file back from the sweep's
    storage over the driver's local copy, which they then append to. Within one driver the local
    copy is the newest: the stored one is as old as the last sync, so a trial paused and restarted
    before a sync (a HyperBand rung, synchronous PBT) lost the reports it made in between, and with
    them the schedulers' history that the sweep's results read back. These copy the stored file back
    only where the driver has no local copy (a restored sweep). Independent of :data:`SWITCH_ENV`.
    """
    if _load(_RESTORE_FROM_REMOTE) is None:
        return []
    from pathlib import Path

    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    class KeepLocalCopy:
        """Copy a trial's file back from storage only where this driver has none."""

        def _restore_from_remote(self, file_name: str, trial: Any) -> None:
            if Path(trial.local_path, file_name).exists():
                return
            super()._restore_from_remote(file_name, trial)  # type: ignore[misc]

    class JsonLogger(KeepLocalCopy, JsonLoggerCallback):
        """Tune's result.json logger that keeps this driver's copy."""

    class CsvLogger(KeepLocalCopy, CSVLoggerCallback):
        """Tune's progress.csv logger that keeps this driver's copy."""

    loggers: list[Any] = [JsonLogger(), CsvLogger()]  # type: ignore[no-untyped-call]
    return loggers


def mask_job_entrypoint() -> None:
    """Make the command line that ``ray.init`` records as the job's entrypoint (in the job table that
    the dashboard and ``ray list jobs`` show to every user of a cluster) a masked one: a key given on
    the command line (``inference.endpoint.base_url=...?api_key=...``) is not kept there.

    Ray reads the process's command line itself, at ``ray.init``. Unlike the other internals here,
    this one does not follow :data:`SWITCH_ENV`: it keeps a credential out of Ray, whatever Ray runs.
    """
    import ray._private.utils

    read = _load(_ENTRYPOINT_NAME)
    if read is None or getattr(read, "_rayft_masked", False):
        return

    def masked_entrypoint() -> str:
        return redact(read())

    masked_entrypoint._rayft_masked = True  # type: ignore[attr-defined]
    ray._private.utils.get_entrypoint_name = masked_entrypoint


def divert_cluster_errors(take: Callable[[list[str]], bool]) -> None:
    """Hand the errors a Ray cluster pushes to this driver to ``take`` before Ray prints them.

    Ray's driver prints those errors (a worker that died, with its lease, worker and node ids; an actor
    task that failed, say Serve's controller's as Serve stops) straight to stdout as ``(raylet) ...``
    lines, from its error listener thread, through ``print_to_stdstream`` (by its module-level name, so
    replacing it there is seen). ``take(lines)`` returns whether it kept them; if not, Ray prints them.
    Lines of the workers' own output (any other pid) go on to Ray as they are. Installed once per process,
    before ``ray.init``; with :data:`SWITCH_ENV` off, Ray prints them as it does.
    """
    if not enabled():
        return
    import ray._private.worker

    original = _load(_PRINT_TO_STDSTREAM)
    if original is None or getattr(original, "_rayft_diverted", False):
        return

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet" and take(list(data.get("lines") or ())):
            return
        original(data, ignore_prefix)

    print_to_stdstream._rayft_diverted = True  # type: ignore[attr-defined]
    ray._private.worker.print_to_stdstream = print_to_stdstream
