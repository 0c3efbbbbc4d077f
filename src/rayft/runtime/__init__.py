"""Starting or joining a Ray cluster for the duration of a command.

The forms of ``--address`` are :mod:`rayft.runtime.address`; the fast checks of a head before
joining it, :mod:`rayft.runtime.probe`. What a Ray that rayft starts itself runs differently (Ray
internals, one switch) is in :mod:`rayft._ray_private`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping

from rayft._ray_private import (
    divert_cluster_errors,
    lean_head,
    local_init_kwargs,
    local_process_env,
    mask_job_entrypoint,
)
from rayft.console import cluster_errors_to_log_file, quiet_ray
from rayft.errors import ClusterError, exception_chain, first_line
from rayft.runtime.address import parse_address
from rayft.runtime.probe import check_gcs, check_tcp, resolve_auto, token_fix

log = logging.getLogger(__name__)

# Every worker process of a Ray that rayft starts or joins masks credentials in what it logs and
# prints, as the driver does (Ray runs the hook in each worker before any task).
WORKER_RUNTIME_ENV = {"worker_process_setup_hook": "rayft.security.install_redaction"}

# On a Ray that rayft started, each training worker process runs Ray's own work (Ray core's task
# loop, which wakes every 10 ms to check for signals and takes the GIL to do so, and the controller's
# health polls) on its main thread at idle CPU priority, so that it does not preempt the training
# thread of either worker (see rayft.training.loop.entry.idle_main_thread). Exporting this variable as
# 0 keeps the main thread at the training thread's priority, as on a joined cluster.
IDLE_MAIN_THREAD_ENV = "RAYFT_IDLE_WORKER_MAIN_THREAD"

# Whether this process started the Ray it is connected to (see :func:`owns_ray`).
_STARTED_HERE = {"ray": False}


@contextlib.contextmanager
def ray_runtime(address: str | None = None, *, metrics: bool = False) -> Iterator[None]:
    """Use the Ray already initialised in this process, join ``address``, or start a local one
    (with Ray's metrics collection on when ``metrics``: ``logging.prometheus``).

    A cluster started here is shut down on exit; one that was joined or already running is left.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    quiet_ray()
    keep_cluster_errors_off_console()
    mask_job_entrypoint()
    # A Ray Job's driver (rayft submit) runs with RAY_ADDRESS set to the cluster that runs the job.
    address = address or os.environ.get("RAY_ADDRESS", "").strip() or None
    if address:
        log.info("joining the Ray cluster at %s", address)
        _join(address)
    else:

        def init() -> None:
            with environment(local_process_env(os.environ)), lean_head(joinable=False):
                ray.init(
                    include_dashboard=False,
                    log_to_driver=True,
                    runtime_env=WORKER_RUNTIME_ENV,
                    **local_init_kwargs(os.environ, metrics=metrics),
                )

        start_local_ray(init, ray.shutdown)
        mark_started_here()
    if metrics:
        log_metrics_endpoints()
    try:
        yield
    finally:
        ray.shutdown()
        mark_started_here(False)
        forget_checked_addresses()


def keep_cluster_errors_off_console() -> None:
    """The errors Ray's cluster pushes to this driver go to the log file, not the console (unless verbose)."""
    divert_cluster_errors(cluster_errors_to_log_file)


_START_TIMEOUTS = (
    "timed out during startup",  # the raylet did not register with the GCS in time (ray/_private/node.py)
    "timed out after",  # the object store did not appear (ray/_private/services.py)
    "timed out waiting for node info",
)
"""What Ray's exceptions say when a node it starts does not come up in time (a loaded machine)."""


def start_timeout_cause(exc: BaseException) -> str | None:
    """The first line of Ray's message when ``exc`` is a start that timed out (None for any other error)."""
    for error in exception_chain(exc):
        line = first_line(error)
        if any(text in line.lower() for text in _START_TIMEOUTS):
            return line
    return None


def start_local_ray(init: Callable[[], None], shutdown: Callable[[], None]) -> None:
    """Start a local Ray with ``init``; a start that times out is cleared with ``shutdown`` and tried once
    more, and a second timeout is one ClusterError line with the cause and the fix (Ray's own exception
    runs to some fifty lines)."""
    for attempt in (1, 2):
        try:
            init()
            return
        except Exception as exc:  # decided below: a start timeout is retried, anything else raised as it is
            cause = start_timeout_cause(exc)
            if cause is None:
                raise
            shutdown()  # the processes the failed start left
            if attempt == 1:
                log.warning("a local Ray did not start in time (%s); trying once more", cause)
                continue
            raise ClusterError(
                f"a local Ray did not start in time, twice ({cause}); this machine's load average is "
                f"{_load_average()} on {os.cpu_count()} CPUs. Run the command again once the load drops, or start "
                "Ray yourself (`ray start --head`) and pass --address auto"
            ) from exc


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # no load average on this platform
        return "unknown"


def log_metrics_endpoints() -> list[str]:
    """Log (and return) where each node of this Ray exports its metrics, rayft's among them, for a
    Prometheus to scrape."""
    import ray

    endpoints = [
        f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"
        for node in ray.nodes()
        if node.get("Alive") and node.get("MetricsExportPort")
    ]
    for endpoint in endpoints:
        log.info("Ray exports metrics (rayft's among them) at http://%s/metrics", endpoint)
    return endpoints


def ray_is_initialized() -> bool:
    """Whether this process is connected to a Ray already."""
    import ray

    return bool(ray.is_initialized())


def mark_started_here(started: bool = True) -> None:
    """Record that this process started the local Ray it is connected to (or no longer is)."""
    _STARTED_HERE["ray"] = started


def owns_ray() -> bool:
    """Whether the Ray this process is connected to was started here, for this process alone: a
    local, single-node Ray without a dashboard that ends with the command. Runs on it may drop
    services that only a shared, long-lived cluster needs."""
    import ray

    return _STARTED_HERE["ray"] and ray.is_initialized()


def local_idle_main_thread(environ: Mapping[str, str]) -> bool:
    """Whether the training workers on a Ray that rayft started run their main thread at idle CPU
    priority (:data:`IDLE_MAIN_THREAD_ENV`; on unless exported as ``0``)."""
    return environ.get(IDLE_MAIN_THREAD_ENV, "1").strip() != "0"


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` in this process's environment for the duration (the processes started
    meanwhile inherit them; Ray Train passes the ones it knows on to its controller and workers),
    then restore what was there."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_ANSWERED: set[str] = set()
"""The addresses whose cluster answered :func:`check_address` since this process last left a Ray:
the CLI, the driver and :func:`ray_runtime` each check before they need the cluster, and one
command probes it once."""


def check_address(address: str) -> str:
    """Check within seconds that a Ray cluster to join answers at ``address`` and accepts this
    process's token (where Ray itself would retry for 20 s and end in a traceback); return the
    address to pass to ``ray.init``. Fails with a :class:`~rayft.errors.ClusterError` naming the fix.

    An address that answered is not probed again until this process leaves its Ray
    (:func:`forget_checked_addresses`)."""
    target = resolve_auto(parse_address(address))
    if target.text in _ANSWERED:
        return target.text
    if target.kind == "jobs":
        raise ClusterError(
            f"--address {target.text} is a Ray Jobs API URL: a command given it on the command line runs as a Ray "
            f"Job; in a config (scaling.address) use `rayft submit CONFIG --address {target.text}` instead."
        )
    if target.kind == "gcs":
        check_gcs(target.text)
    else:
        check_tcp(target)
    _ANSWERED.add(target.text)
    return target.text


def forget_checked_addresses() -> None:
    """Probe every address again at its next :func:`check_address` (a cluster left may be gone)."""
    _ANSWERED.clear()


def join_runtime_env(target: str, environ: Mapping[str, str]) -> dict[str, object]:
    """The runtime environment of the processes of a job that joins the cluster at ``target``.

    Ray's own actors of a run (Ray Train's placement-group cleaner among them) ask the state API for
    the cluster "auto", which fails with "Found multiple active Ray instances" on a machine that runs
    several heads, and the cleaner then dies with a traceback on the console. ``RAY_ADDRESS`` names
    the cluster for them. A Ray Job's driver (``environ`` holds its job config) keeps the variables
    its submission set: Ray refuses a job whose driver sets one of them again."""
    runtime_env: dict[str, object] = dict(WORKER_RUNTIME_ENV)
    if parse_address(target).kind == "gcs" and "RAY_JOB_CONFIG_JSON_ENV_VAR" not in environ:
        runtime_env["env_vars"] = {"RAY_ADDRESS": target}
    return runtime_env


def _join(address: str) -> None:
    """Connect to the cluster at ``address`` (checked first by :func:`check_address`)."""
    import ray

    target = check_address(address)
    try:
        ray.init(address=target, log_to_driver=True, runtime_env=join_runtime_env(target, os.environ))
    except Exception as exc:  # ray raises ConnectionError wrapping its AuthenticationError
        chain = [f"{type(e).__name__}: {e}" for e in exception_chain(exc)]
        if any("InvalidAuthToken" in t or "AuthenticationError" in t for t in chain):
            raise ClusterError(token_fix(address)) from exc
        raise ClusterError(
            f"--address {address}: could not join the Ray cluster ({chain[0].splitlines()[0][:300]}). Check that the "
            "head is running (`ray status --address ...`) and that this address and port are reachable."
        ) from exc
