"""Building, starting and stopping the ``rayft serve`` application on Ray Serve.

:func:`deployment_options` turns ``serve:`` into Serve's deployment options (pure; the RayService
manifest and the vLLM configs use it too). :func:`start` deploys a :class:`~rayft.serving.plan.ServePlan`
on the Ray this process uses and returns the base URL; :func:`stop` drains the router (503 to new
requests, the requests in flight finished up to ``serve.graceful_shutdown_timeout_s``, a stream still
running then ended with an error event), then deletes the application and stops Serve.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from rayft.config.serve import ServeConfig
from rayft.console import FILE_ONLY
from rayft.errors import ConfigError
from rayft.serving.access_log import FILE_LOG_LEVEL, controller_log_level, quiet_serve_console
from rayft.serving.drain import CUT_WAIT_S
from rayft.serving.keys import exposure_warning, load_key_digests
from rayft.serving.plan import ServePlan

log = logging.getLogger(__name__)

APP_NAME = "rayft"

# rayft's deployments log at this level to Serve's files (the access log is at INFO), whatever the level of
# Serve's controller and proxies; what reaches the console is gated in each replica (quiet_serve_console).
FILE_LOG = {"log_level": FILE_LOG_LEVEL}


def deployment_options(cfg: ServeConfig) -> dict[str, Any]:
    """Serve's options of each base model's deployment: replicas or autoscaling bounds, resources, draining."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": cfg.num_cpus_per_replica, "num_gpus": cfg.num_gpus_per_replica},
        "max_ongoing_requests": cfg.max_ongoing_requests,
        "graceful_shutdown_timeout_s": cfg.graceful_shutdown_timeout_s,
        **queue_options(cfg),
    }
    if cfg.min_replicas is None:
        return {**options, "num_replicas": cfg.num_replicas}
    autoscaling = {
        "min_replicas": cfg.min_replicas,
        "max_replicas": cfg.max_replicas,
        "target_ongoing_requests": cfg.target_ongoing_requests,
    }
    return {**options, "autoscaling_config": autoscaling}


def queue_options(cfg: ServeConfig, bound: int | None = None) -> dict[str, Any]:
    """Serve's bound on the requests a caller holds for a deployment (``bound``, else serve_queue_requests; -1:
    none, when serve_queue_requests is unset), and its 503's Retry-After."""
    if cfg.serve_queue_requests is None:
        bound = -1
    elif bound is None:
        bound = cfg.serve_queue_requests
    return {
        "max_queued_requests": bound,
        "backpressure_config": {"status_code": 503, "retry_after_s": cfg.serve_retry_after_s},
    }


def router_capacity(cfg: ServeConfig, groups: int) -> int:
    """Requests the router takes at once: all that the model replicas and Serve's queues for them can hold,
    and as many again as those queues, so that a request beyond a full queue reaches the router and is
    refused there, at once and in OpenAI's error shape (``server_busy``), not by Serve's proxy in its own
    shape, which only a router beyond this bound leaves to answer."""
    replicas = cfg.max_replicas if cfg.max_replicas is not None else cfg.num_replicas
    queued = cfg.serve_queue_requests or 0
    return groups * (cfg.max_ongoing_requests * replicas + 2 * queued)


def build_application(plan: ServePlan, cfg: ServeConfig, key_digests: tuple[bytes, ...] = ()) -> Any:
    """The Serve application: one deployment per base model, behind the OpenAI router (which asks for
    one of the keys of ``key_digests``, when there are any)."""
    from ray import serve

    from rayft.serving.engine import EngineSettings
    from rayft.serving.replica import replica_class
    from rayft.serving.router import Router

    replica = replica_class(cfg.max_adapters_per_replica)
    settings = EngineSettings.of(cfg)
    capacity = router_capacity(cfg, len(plan.groups))
    models = [
        serve.deployment(name=f"model-{index}", logging_config=FILE_LOG, **deployment_options(cfg))(replica).bind(
            group, settings, cfg.access_log_console
        )
        for index, group in enumerate(plan.groups)
    ]
    router = serve.deployment(
        name="router",
        logging_config=FILE_LOG,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=capacity,
        graceful_shutdown_timeout_s=cfg.graceful_shutdown_timeout_s,
        # The proxy counts a request as queued until it is assigned to the router, so requests that arrive
        # together count together: with the models' small bound, the proxy would refuse some in its own shape
        # while the router has room. Bounded by the router's capacity, it refuses only beyond that.
        **queue_options(cfg, bound=capacity),
    )(Router)
    return router.bind(models, plan.routes, key_digests, cfg.access_log_console, cfg.max_runtime_adapters)


def free_port(host: str) -> int:
    """A TCP port nobody listens on now, for ``port: 0``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def start(plan: ServePlan, cfg: ServeConfig, host: str, port: int) -> str:
    """Deploy the plan on the Ray this process uses (waits until every replica is up); the base URL."""
    from ray import serve

    digests = load_key_digests(cfg.api_keys_env, cfg.api_keys_file)
    if warning := exposure_warning(host, bool(digests), cfg.api_keys_env):
        log.warning(warning)
    if port and _http_port() is None:  # Serve not running yet: its proxy will bind the port
        check_port_free(host, port)
    port = port or free_port(host)
    start_serve(host, port)
    actual = serve.status().proxies and _http_port()
    if actual and actual != port:
        raise ConfigError(
            f"Ray Serve already runs on this cluster with its HTTP port at {actual}, not {port}; serve on port "
            f"{actual}, or stop the other Serve application first (serve shutdown)"
        )
    serve.run(build_application(plan, cfg, digests), name=APP_NAME, route_prefix="/")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}/v1"


def start_serve(host: str, port: int) -> None:
    """Start Serve (or reach the one running) with its HTTP proxy on ``host:port``, its own lines off this
    console and its controller's and proxies' console (see :mod:`rayft.serving.access_log`)."""
    from ray import serve

    quiet_serve_console()
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": controller_log_level()})


def check_port_free(host: str, port: int) -> None:
    """Fail fast, in one line, where Serve's proxy could not listen (it would retry, then fail deep in Ray)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); another server may use the port: choose "
                "another --port (0: a free one), or stop that server"
            ) from None


def _http_port() -> int | None:
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    options = client.http_config if client is not None else None
    return int(options.port) if options is not None else None


def stop(drain_s: float | None = None) -> None:
    """Drain rayft's router for up to ``drain_s`` (None: an application without it, vLLM's), delete the
    application, then stop Serve unless other applications run on it (a shared cluster's)."""
    from ray import serve

    if drain_s is not None:
        drain(drain_s)
    serve.delete(APP_NAME)
    if not serve.status().applications:
        serve.shutdown()


def drain(grace_s: float) -> None:
    """Have the router answer new requests with a 503 and let those in flight end, for up to ``grace_s``; the
    streams still running then end with an error event (see :mod:`rayft.serving.drain`). Serve's delete
    drains by itself whatever a router that cannot be reached leaves."""
    from ray import serve

    try:
        cut = serve.get_app_handle(APP_NAME).drain.remote(grace_s).result(timeout_s=grace_s + CUT_WAIT_S + 30)
    except Exception as exc:  # a router already gone: Serve's delete is the drain left
        log.warning("the router did not drain (%s: %s); Serve's delete drains the requests left",
                    type(exc).__name__, exc, extra=FILE_ONLY)  # fmt: skip
        return
    if cut:
        log.warning("stopped %d stream(s) still running after %g s (serve.graceful_shutdown_timeout_s); each "
                    "ended with a server_shutting_down error event", cut, grace_s)  # fmt: skip
