"""Starting one local Ray instance for a whole test session (start-up costs seconds here)."""

from __future__ import annotations

import os
from typing import Any

from rayft._ray_private import lean_head, local_init_kwargs, local_process_env
from rayft.runtime import environment, mark_started_here


def start_local_ray(num_cpus: int = 2, **kwargs: Any) -> Any:
    """Start (or reuse) a local Ray instance sized for CPU tests, quiet and without a dashboard.

    Returns the ``ray`` module's context object; call ``ray.shutdown()`` when done.
    """
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context()

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kwargs = local_init_kwargs(os.environ) | kwargs  # as `rayft` starts its local Ray
    with environment(local_process_env(os.environ)), lean_head():
        context = ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
            **kwargs,
        )
    mark_started_here()  # runs on it take the same path as on the Ray `rayft` starts
    return context
