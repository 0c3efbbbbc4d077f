"""Where a run lives: a local directory, or a URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``) with a local
mirror that training writes into and uploads from.

Pure planning only (no I/O): is a ``storage_path`` remote, the URI of a run under it, the mirror
directory of that run, and the URI as it may be shown or written (credentials masked). The
uploads and downloads are :mod:`rayft.runs.remote`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from rayft.config.checks import is_remote
from rayft.errors import ConfigError, StorageError
from rayft.security import mask_uri

MIRRORS_DIR = "runs"
"""The folder of the cache that holds the local mirrors of remote runs."""
WORKERS_DIR = "workers"
"""The folder of a node's cache that holds the working directories of a remote run's workers there."""
LOGS_DIR = "logs"
"""The folder of the cache that holds the driver logs of remote runs (their mirrors are reset on a start)."""


def join_uri(base: str, *parts: str) -> str:
    """``base`` with path segments appended before its query string: ``s3://b/p?x=1`` + ``run`` is
    ``s3://b/p/run?x=1``."""
    path, sep, query = base.partition("?")
    joined = "/".join([path.rstrip("/"), *(p.strip("/") for p in parts)])
    return f"{joined}{sep}{query}"


def mirror_dir(storage_uri: str, name: str, cache: Path) -> Path:
    """The local mirror of run ``name`` under ``storage_uri``: ``<cache>/runs/<hash>/<name>``.

    The hash is of the masked URI, so that rotating a key embedded in the URI keeps the mirror.
    """
    digest = hashlib.sha256(mask_uri(storage_uri).encode("utf-8")).hexdigest()[:12]
    return cache / MIRRORS_DIR / digest / name


def worker_dir(run_uri: str, cache: Path) -> Path:
    """Where the Ray workers of the remote run at ``run_uri`` stage their files on their own node:
    ``<cache>/workers/<hash>/<run name>``, ``cache`` being that node's cache.

    Apart from the driver's mirror (``<cache>/runs/...``) even when both are on one machine: the
    workers never read or write the driver's files, so no node relies on another's disk.
    """
    masked = mask_uri(run_uri)
    digest = hashlib.sha256(masked.encode("utf-8")).hexdigest()[:12]
    name = masked.partition("?")[0].rstrip("/").rsplit("/", 1)[-1] or "run"
    return cache / WORKERS_DIR / digest / name


@dataclass(frozen=True)
class RunLocation:
    """Where a run is written: ``local_dir`` always (the run directory, or the mirror of a remote
    run), and ``remote_uri`` (credentials included, never shown) when the run's durable home is a URI."""

    local_dir: Path
    remote_uri: str | None = None

    @property
    def display(self) -> str:
        """The run's durable location as it may be logged: the masked URI, or the local directory."""
        return mask_uri(self.remote_uri) if self.remote_uri else str(self.local_dir)

    @property
    def shown_uri(self) -> str | None:
        """The run's URI as it may be shown (credentials masked), or None for a run in a directory."""
        return mask_uri(self.remote_uri) if self.remote_uri else None

    def storage_under(self, *parts: str) -> str:
        """A ``storage_path`` inside this run, for the runs nested in it (a sweep's trials, a
        pipeline's train stage): under its URI, or under its directory."""
        if self.remote_uri is not None:
            return join_uri(self.remote_uri, *parts)
        return str(self.local_dir.joinpath(*parts))

    def with_mirror(self, mirror: Path) -> RunLocation:
        """This location with ``mirror`` as the local mirror of a remote run (a run in a directory
        is written in place, and stays as it is)."""
        return self if self.remote_uri is None else RunLocation(mirror, self.remote_uri)

    def on_node(self, cache: Path) -> RunLocation:
        """Where a Ray Train worker on this node writes: the run directory, which every node sees,
        or, for a run at a URI, a directory of its own under the node's ``cache``
        (:func:`worker_dir`)."""
        return self if self.remote_uri is None else RunLocation(worker_dir(self.remote_uri, cache), self.remote_uri)

    def refuse_remote(self, reason: str) -> None:
        """Raise a ConfigError ``storage_path='<masked URI>': <reason>`` when the run is at a URI:
        for a way of running that writes only to a directory (or a mount every node shares)."""
        if self.remote_uri is not None:
            raise ConfigError(f"storage_path={self.display!r}: {reason}")


def plan_run_location(storage_path: str, name: str, cache: Path) -> RunLocation:
    """The location of run ``name`` under ``storage_path`` (``cache`` holds mirrors of remote runs)."""
    if is_remote(storage_path):
        return RunLocation(mirror_dir(storage_path, name, cache), join_uri(storage_path, name))
    return RunLocation(Path(storage_path).expanduser().resolve() / name)


def storage_root(storage_path: str) -> str:
    """``storage_path`` as a place other tools (Ray Tune) are given: a URI as it is, a directory
    made absolute."""
    return storage_path if is_remote(storage_path) else str(Path(storage_path).expanduser().resolve())


def log_dir(storage_path: str, name: str, cache: Path) -> Path:
    """Where the driver's log of run ``name`` goes: the run directory, or, for a URI, a folder of
    ``cache`` (a remote run's mirror is reset when it starts)."""
    if is_remote(storage_path):
        return cache / LOGS_DIR / name
    return Path(storage_path).expanduser() / name


def local_run_dir(storage_path: str, name: str, *, command: str, fix: str) -> Path:
    """The local directory of run ``name`` for a command that writes only to local storage; a
    URI ``storage_path`` is refused (rather than written to a local folder named after it).

    Args:
        storage_path: The configured ``storage_path``.
        name: The run name.
        command: The command, for the message (``rayft sdg``).
        fix: How to give the command a local directory (an option or config field).
    """
    if is_remote(storage_path):
        raise StorageError(
            f"storage_path {mask_uri(storage_path)}: `{command}` writes only to a local directory or shared mount; "
            f"{fix}, or use a local storage_path (only `rayft train` writes to URIs)"
        )
    return Path(storage_path).expanduser() / name
