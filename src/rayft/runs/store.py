"""A run's durable home behind one interface: a local (or mounted) directory, or a URI with a local
mirror. Callers ask the store what it holds and let it carry out the start plan; they do not branch
on whether the run is remote.

Training always writes into ``store.local_dir`` (the run directory, or the remote run's mirror);
the workers upload to ``store.remote_uri`` as they commit checkpoints (:mod:`rayft.runs.remote`).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from rayft.config.loader import read_yaml
from rayft.errors import StorageError
from rayft.runs import layout
from rayft.runs.checkpoints import remove_incomplete, scan_checkpoints
from rayft.runs.location import RunLocation
from rayft.runs.manifest import Manifest, read_manifest
from rayft.runs.planner import RunState, StartPlan
from rayft.runs.remote import LOG_PATHS, RemoteRun

log = logging.getLogger("rayft.runs")


class RunStore(Protocol):
    """Where one run is stored, and the few operations a driver needs before and after training."""

    local_dir: Path
    """Where this process writes: the run directory, or the local mirror of a remote run."""
    remote_uri: str | None
    """The run's URI (credentials included, never shown) when its durable home is one, else None."""
    where: str
    """The run's location as it may be shown in messages (a directory, or a URI without its query)."""
    can_replace: bool
    """Whether an earlier run can be moved aside and kept (a directory can; a URI cannot)."""

    def probe(self) -> None:
        """Fail with a StorageError, before any work, when the store cannot be written."""

    def state(self) -> RunState:
        """What the store holds of the run."""

    def saved_config(self) -> dict[str, Any] | None:
        """The config saved in the run (``config.yaml``), or None when there is none."""

    def final_manifest(self) -> Manifest | None:
        """The manifest of the run's ``final/``, or None when the run did not finish."""

    def begin(self, plan: StartPlan, config_text: str) -> None:
        """Carry out ``plan`` and save ``config_text`` as the run's config (nothing for ``keep``)."""

    def persist(self, rel: str) -> None:
        """Make a file or folder written under ``local_dir`` durable (a no-op for a directory; an
        upload for a URI; a missing one is skipped)."""

    def fetch(self, rel: str) -> None:
        """Bring a file of the run that this machine lacks into ``local_dir`` (a no-op for a
        directory; a download, when the URI has it, for a URI)."""

    def fetch_results(self) -> None:
        """Bring what the workers wrote at the end (final/, rank 0's logs) into ``local_dir`` (a
        no-op for a directory; for a URI, rank 0 may have uploaded them from another node)."""


class LocalRunStore:
    """A run in a local (or mounted) directory."""

    remote_uri: str | None = None
    can_replace = True

    def __init__(self, run_dir: Path) -> None:
        self.local_dir = run_dir
        self.where = str(run_dir)

    def probe(self) -> None:
        """Nothing to check before the config is written (a write error there names the directory)."""

    def state(self) -> RunState:
        """Saved config, readable final/ manifest and complete checkpoints of the directory."""
        steps = tuple(c.step for c in scan_checkpoints(self.local_dir / layout.CHECKPOINTS_DIR) if c.complete)
        finished = read_manifest(self.local_dir / layout.FINAL_DIR) is not None
        metrics = self.local_dir / layout.METRICS_FILE
        logged = metrics.is_file() and metrics.stat().st_size > 0
        return RunState((self.local_dir / layout.CONFIG_FILE).is_file(), finished, steps, logged)

    def saved_config(self) -> dict[str, Any] | None:
        """The parsed ``config.yaml`` of the directory, or None."""
        saved = self.local_dir / layout.CONFIG_FILE
        return read_yaml(saved) if saved.is_file() else None

    def final_manifest(self) -> Manifest | None:
        """The manifest of ``final/``."""
        return read_manifest(self.local_dir / layout.FINAL_DIR)

    def begin(self, plan: StartPlan, config_text: str) -> None:
        """Move an earlier run aside (replace), clear what a start that trained nothing left (restart),
        or drop its incomplete checkpoints (resume); save the config."""
        if plan.action == "keep":
            return
        if plan.action == "replace":
            move_aside(self.local_dir)
        if plan.action == "restart":
            clear_untrained(self.local_dir)
        if plan.action == "resume":
            remove_incomplete(self.local_dir / layout.CHECKPOINTS_DIR)
        write_text(self.local_dir / layout.CONFIG_FILE, config_text)

    def persist(self, rel: str) -> None:
        """Nothing to do: the file is already in the run directory."""

    def fetch(self, rel: str) -> None:
        """Nothing to do: the run directory is here."""

    def fetch_results(self) -> None:
        """Nothing to do: the workers wrote into the run directory."""


class RemoteRunStore:
    """A run at a URI, written through a local mirror that starts empty (a cache of the remote run)."""

    can_replace = False

    def __init__(self, remote: RemoteRun, mirror: Path, uri: str) -> None:
        self.local_dir = mirror
        self.remote_uri: str | None = uri
        self.remote = remote
        self.where = remote.where.partition("?")[0]

    def probe(self) -> None:
        """Write and delete a marker object at the URI."""
        self.remote.probe()

    def state(self) -> RunState:
        """What the URI holds of the run."""
        return self.remote.run_state()

    def saved_config(self) -> dict[str, Any] | None:
        """The parsed remote ``config.yaml``, or None."""
        text = self.remote.read_text(layout.CONFIG_FILE)
        return None if text is None else dict(yaml.safe_load(text) or {})

    def final_manifest(self) -> Manifest | None:
        """The manifest of the remote ``final/``."""
        return self.remote.manifest(layout.FINAL_DIR)

    def begin(self, plan: StartPlan, config_text: str) -> None:
        """Reset the mirror; on resume drop unfinished uploads and fetch the logs and the tracker run
        ids, so a run continues on a machine that never saw it (the workers fetch the checkpoint they
        resume from themselves, on their own nodes); save and upload the config."""
        if plan.action == "keep":
            return
        if plan.action == "replace":
            raise StorageError(f"{self.where}: a run at a URI cannot be moved aside; delete it or choose another name")
        shutil.rmtree(self.local_dir, ignore_errors=True)
        if plan.action == "resume":
            self.remote.remove_incomplete()
            self.remote.download_logs(self.local_dir, (*LOG_PATHS, layout.TRACKING_FILE))
        write_text(self.local_dir / layout.CONFIG_FILE, config_text)
        self.persist(layout.CONFIG_FILE)
        log.info("run stored at %s, written through the local mirror %s", self.remote.where, self.local_dir)

    def persist(self, rel: str) -> None:
        """Upload a file or folder of the mirror to the same place under the URI."""
        self.remote.upload_logs(self.local_dir, (rel,))

    def fetch(self, rel: str) -> None:
        """Download a file of the run when the mirror lacks it and the URI has it."""
        if not (self.local_dir / rel).exists() and self.remote.is_file(rel):
            self.remote.download_file(rel, self.local_dir / rel)

    def fetch_results(self) -> None:
        """Download final/ and rank 0's logs into the mirror (a final/ already there with the same
        manifest is kept)."""
        self.remote.download_results(self.local_dir)


def open_store(location: RunLocation) -> RunStore:
    """The store of a run at ``location``."""
    if location.remote_uri is None:
        return LocalRunStore(location.local_dir)
    return RemoteRunStore(RemoteRun(location.remote_uri), location.local_dir, location.remote_uri)


def move_aside(directory: Path) -> None:
    """Keep an earlier output that is about to be redone, under a dated name beside it."""
    if not directory.exists():
        return
    target = directory.with_name(f"{directory.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    log.warning("keeping the earlier %s output as %s", directory.name, target)
    directory.rename(target)


UNTRAINED_LEFTOVERS = (
    layout.CONFIG_FILE,
    layout.METRICS_FILE,
    layout.TENSORBOARD_DIR,
    layout.TRACKING_FILE,
    layout.TRACKING_UNSENT_FILE,
    layout.DATA_DIR,
    layout.CHECKPOINTS_DIR,
    layout.STOP_REQUEST_FILE,
)
"""What a start that trained no step may leave in its run directory, and a restart deletes (``logs/``,
which the retry's own log is appended to, stays, and so does anything rayft did not write)."""


def clear_untrained(directory: Path) -> None:
    """Delete what a start that trained no step left in a run directory (:data:`UNTRAINED_LEFTOVERS`)."""
    for name in UNTRAINED_LEFTOVERS:
        entry = directory / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def write_text(path: Path, text: str) -> None:
    """Write a file of a run, with a StorageError naming it when the storage is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StorageError(
            f"storage_path: cannot write {path} ({exc.strerror}); choose a writable directory with storage_path=..."
        ) from exc
