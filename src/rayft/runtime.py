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
        _join(address)
    else:
        ray.init(include_dashboard=False, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()


def _join(address: str) -> None:
    """Connect to the cluster at ``address``, naming the fix when it refuses the connection."""
    import os

    import ray

    from rayft.errors import exception_chain

    try:
        ray.init(address=address, log_to_driver=True)
    except Exception as exc:  # ray raises ConnectionError wrapping its AuthenticationError
        text = f"{type(exc).__name__}: {exc}"
        chain = [f"{type(e).__name__}: {e}" for e in exception_chain(exc)]
        if any("InvalidAuthToken" in t or "AuthenticationError" in t for t in chain):
            mode = os.environ.get("RAY_AUTH_MODE", "unset")
            raise ConnectionError(
                f"--address {address}: the Ray cluster requires token authentication and this process did not "
                f"present a valid token (RAY_AUTH_MODE={mode}). Fix: export RAY_AUTH_MODE=token and provide the "
                "cluster's token as RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token "
                "(`ray get-auth-token` on the head prints it)."
            ) from exc
        raise ConnectionError(
            f"--address {address}: could not join the Ray cluster ({text.splitlines()[0][:300]}). Check that the "
            "head is running (`ray status --address ...`) and that this address and port are reachable."
        ) from exc
