"""Starting or joining a Ray cluster for the duration of a command."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def ray_runtime(address: str | None = None) -> Iterator[None]:
    """Use the Ray already initialised in this process, join ``address``, or start a local one.

    A cluster started here is shut down on exit; one that was joined or already running is left.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    if address:
        log.info("joining the Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(include_dashboard=False, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()
