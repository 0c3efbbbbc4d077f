"""Fast checks of a Ray head before rayft uses it: one request each, a few seconds at most.

Ray's own clients wait 20 s or more, retrying and logging, before they report a refused token or
an unreachable head; these checks report the same causes in one line, with the fix.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from rayft.errors import ClusterError
from rayft.runtime.address import JOBS_API_FIX, START_HEAD_HINT, ClusterAddress, jobs_url_from_dashboard, parse_address

PROBE_TIMEOUT_S = 5.0


def token_fix(address: str) -> str:
    """The error for a head whose token authentication refused this process."""
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    return (
        f"--address {address}: the Ray cluster requires token authentication and this process did not present "
        f"a valid token (RAY_AUTH_MODE={mode}). Fix: export RAY_AUTH_MODE=token and provide the cluster's token "
        "as RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token (`ray get-auth-token` on "
        "the head prints it)."
    )


def auth_metadata() -> dict[str, str]:
    """The token header this process presents to a head (empty unless RAY_AUTH_MODE=token finds one)."""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    return {key.lower(): value for key, value in get_auth_headers_if_auth_enabled({}).items()}


def resolve_auto(address: ClusterAddress) -> ClusterAddress:
    """The GCS address ``auto`` stands for here (``RAY_ADDRESS``, else the head started on this machine)."""
    if address.kind != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env.startswith(("http://", "https://", "ray://")):
        return parse_address(env, "RAY_ADDRESS")
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as exc:
        found, why = None, str(exc).splitlines()[0]
    else:
        why = "RAY_ADDRESS is unset and no head was started on this machine"
    if not found:
        raise ClusterError(f"--address auto: no Ray cluster found ({why}); {START_HEAD_HINT}")
    return ClusterAddress("gcs", found)


def check_gcs(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Ask the GCS at ``host:port`` for its cluster id; a refused token, a closed port or something
    that is not a Ray head fails here within ``timeout_s`` with the fix."""
    import grpc

    code, details = _gcs_call(address, timeout_s, "GetClusterId")
    if code is None:
        return
    if code == grpc.StatusCode.UNAUTHENTICATED:
        raise ClusterError(token_fix(address))
    if _is_http(details):
        raise ClusterError(
            f"--address {address}: this is an HTTP server, not a Ray head's GCS port. If it is the head's "
            f"dashboard, use --address http://{address} (runs the command as a Ray Job); to join the cluster "
            "directly, use the GCS address `ray start --head` printed (HEAD:6379)."
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise ClusterError(
            f"--address {address}: no Ray head answered within {timeout_s:g} s ({details.splitlines()[0][:200]}); "
            f"{START_HEAD_HINT}."
        )
    raise ClusterError(
        f"--address {address}: something answers there but it is not a Ray head's GCS ({code.name}: "
        f"{details[:200]}); use the address `ray start --head` printed (HEAD:6379)."
    )


def check_tcp(address: ClusterAddress, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Check that something accepts connections at a ``ray://`` (Ray Client) address."""
    import socket

    host, port = address.host_port or ("", 0)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterError(
            f"--address {address.text}: nothing accepts connections there within {timeout_s:g} s "
            f"({type(exc).__name__}: {exc}); {START_HEAD_HINT} (Ray Client listens on port 10001)."
        ) from exc


def dashboard_of(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """The Jobs API URL the head at GCS ``address`` published; a head without one fails with the fix.
    ``address`` may also be the dashboard's ``host:port`` itself (as ``ray job submit`` takes it)."""
    if _is_http(_gcs_call(address, timeout_s, "GetClusterId")[1]):
        return f"http://{address}"
    check_gcs(address, timeout_s)
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with _channel(address) as channel:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        request = gcs_service_pb2.InternalKVGetRequest(  # type: ignore[attr-defined]
            key=b"dashboard", namespace=b"dashboard"
        )
        reply = stub.InternalKVGet(request, timeout=timeout_s, metadata=list(auth_metadata().items()))
    url = jobs_url_from_dashboard(reply.value.decode()) if reply.value else None
    # A head started with --include-dashboard=false still publishes the default dashboard address.
    if url is None or http_get(f"{url}/api/version", timeout_s)[0] is None:
        raise ClusterError(
            f"--address {address}: the Ray head there serves no Jobs API that answers here "
            f"({'it publishes no dashboard' if url is None else f'nothing answers at {url}'}). Fix: {JOBS_API_FIX} "
            "(--dashboard-host=0.0.0.0 makes it reachable from other machines)."
        )
    return url


def check_jobs_api(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Check that ``url`` serves Ray's Jobs API and accepts this process's token; return Ray's version there."""
    status, body = http_get(f"{url}/api/version", timeout_s)
    if status is None:
        raise ClusterError(
            f"--address {url}: cannot reach the Ray Jobs API within {timeout_s:g} s ({body}); {START_HEAD_HINT}."
        )
    if status in (401, 403):
        raise ClusterError(token_fix(url))
    version = _ray_version(body) if status == 200 else None
    jobs_status, _ = http_get(f"{url}/api/jobs/", timeout_s)
    if version is None or jobs_status != 200:
        raise ClusterError(
            f"--address {url}: this server does not serve Ray's Jobs API (/api/version: HTTP {status}, /api/jobs/: "
            f"HTTP {jobs_status}). Fix: {JOBS_API_FIX}."
        )
    return version


def _ray_version(body: str) -> str | None:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    version = data.get("ray_version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def http_get(url: str, timeout_s: float) -> tuple[int | None, str]:
    """(HTTP status, body), or (None, why) when nothing answered in time."""
    request = urllib.request.Request(url, headers=auth_metadata())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return int(reply.status), reply.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"{type(reason).__name__}: {reason}"


def _is_http(details: str) -> bool:
    """Whether a failed gRPC call reached an HTTP/1 server (a dashboard, a proxy) instead of a GCS."""
    return "http1.x server" in details or "Failed parsing HTTP/2" in details


def _channel(address: str) -> Any:
    import grpc

    return grpc.insecure_channel(address)


def _gcs_call(address: str, timeout_s: float, method: str) -> tuple[Any, str]:
    """(None, "") when the GCS answered ``method``, else (gRPC status code, details)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with _channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            getattr(stub, method)(
                gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]
                timeout=timeout_s,
                metadata=list(auth_metadata().items()),
            )
        except grpc.RpcError as exc:
            return exc.code(), str(exc.details() or "")
    return None, ""
