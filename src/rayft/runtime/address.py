"""The forms of ``--address`` and what each one means (pure: no network, no Ray).

- ``auto``: the Ray cluster this machine belongs to (``RAY_ADDRESS``, else the head started here
  with ``ray start``);
- ``host:port``: a head's GCS address, the one ``ray start --head`` prints (port 6379 by default);
  the command's driver joins it directly, so it must run on a machine of the cluster's network;
- ``ray://host:10001``: Ray Client (kept for compatibility; Ray advises against it for Ray Train);
- ``http(s)://host:8265``: the head's Ray Jobs API (its dashboard port); the command runs as a Ray
  Job, its driver on the cluster (``rayft submit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from rayft.errors import ConfigError

AddressKind = Literal["auto", "gcs", "client", "jobs"]

START_HEAD_HINT = (
    "start a head with `ray start --head --dashboard-host=0.0.0.0` (GCS on port 6379, Jobs API on "
    "http://HEAD:8265) or check the host and port"
)
JOBS_API_FIX = (
    "the Jobs API is served by the head's dashboard, which needs `pip install 'ray[default]'` on the head "
    "and a head started without --include-dashboard=false, e.g. `ray start --head --dashboard-host=0.0.0.0 "
    "--dashboard-port=8265`"
)
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed ``--address``: its kind and its normalised text."""

    kind: AddressKind
    text: str

    @property
    def host_port(self) -> tuple[str, int] | None:
        """Host and port of a ``gcs``, ``client`` or ``jobs`` address (None for ``auto``)."""
        if self.kind == "auto":
            return None
        if self.kind == "gcs":
            host, _, port = self.text.rpartition(":")
            return host.strip("[]"), int(port)
        parts = urlsplit(self.text)
        default = {"https": 443, "http": 80, "ray": 10001}[parts.scheme]
        return parts.hostname or "", parts.port or default


def parse_address(address: str, option: str = "--address") -> ClusterAddress:
    """Classify ``address``; a form rayft does not know is refused with the forms it knows."""
    text = address.strip()
    if text == "auto":
        return ClusterAddress("auto", text)
    if _HOST_PORT.match(text):
        _check_port(text.rpartition(":")[2], address, option)
        return ClusterAddress("gcs", text)
    parts = urlsplit(text)
    if parts.scheme in ("http", "https", "ray") and parts.hostname:
        try:
            port = parts.port
        except ValueError:
            port = None
            _check_port("0", address, option)
        if port is not None:
            _check_port(str(port), address, option)
        kind: AddressKind = "client" if parts.scheme == "ray" else "jobs"
        return ClusterAddress(kind, text.rstrip("/"))
    raise ConfigError(
        f"{option} {address!r}: not a Ray address. Use 'auto' (the cluster this machine belongs to), "
        "HOST:PORT (a head's GCS address, e.g. 10.0.0.5:6379), or http://HOST:8265 (the head's Jobs API, "
        "to run the command as a Ray Job)."
    )


def _check_port(port: str, address: str, option: str) -> None:
    if not 0 < int(port) < 65536:
        raise ConfigError(f"{option} {address!r}: the port must be between 1 and 65535")


def jobs_url_from_dashboard(dashboard: str) -> str:
    """The Jobs API URL of a dashboard address as a head publishes it (``host:port``)."""
    return dashboard if "://" in dashboard else f"http://{dashboard}"
