"""A run's durable home behind one interface: a local (or mounted) directory, or a URI with a local
mirror. Callers ask the store what it holds, let it carry out the start plan, and ask it to make
what they wrote durable or to bring what they need; they do not branch on whether the run is remote.

Training always writes into ``store.local_dir``: the run directory, the driver's mirror of a remote
run, or a Ray Train worker's own directory on its node (:meth:`RunLocation.on_node`). The workers'
store uploads to the URI as they commit checkpoints (:mod:`rayft.runs.remote`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from rayft.config.loader import read_yaml
from rayft.errors import StorageError
from rayft.runs import layout
from rayft.runs.checkpoints import (
    keep_only_newest,
    latest_valid_checkpoint,
    publish_checkpoint,
    remove_incomplete,
    scan_checkpoints,
)
from rayft.runs.location import RunLocation
from rayft.runs.lock import node_lock
from rayft.runs.manifest import Manifest, read_manifest
from rayft.runs.planner import RunState, StartPlan
from rayft.runs.remote import LOG_PATHS, WORKER_LOGS, RemoteRun, sync_checkpoint
from rayft.runs.selection import CheckpointInfo, choose_resume

log = logging.getLogger("rayft.runs")


class RunStore(Protocol):
    """Where one run is stored, and the few operations a driver needs before and after training."""

    location: RunLocation
    """Where the run is: the directory this process writes, and the URI when its durable home is one."""
    local_dir: Path
    """Where this process writes (``location.local_dir``): the run directory, or the mirror of a remote run."""
    where: str
    """The run's location as it may be shown in messages (a directory, or a URI without its query)."""
    shown_uri: str | None
    """The run's URI as it may be shown (credentials masked), or None for a run in a directory."""
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

    def checkpoint_manifest(self, name: str) -> Manifest | None:
        """The manifest of the checkpoint ``name`` (``step-N``), or None when it has no readable one."""

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

    def finished(self) -> bool:
        """Whether the run's durable home holds its ``final/``."""

    def checkpoints(self) -> list[CheckpointInfo]:
        """The run's checkpoints in its durable home, complete or not (oldest first)."""

    def where_of(self, rel: str) -> str:
        """A path of the run as it may be shown: in the directory, or under the masked URI."""

    def latest_checkpoint(self, reported: Path | None = None) -> Path | None:
        """The checkpoint to resume from as a local directory (None on a fresh start): the newest
        complete one that verifies, or ``reported`` (the one Ray Train hands back) when it is newer."""

    def copy_checkpoint(self, name: str, dest: Path) -> bool:
        """Copy the checkpoint ``name`` from the durable home into ``dest``, for a reader on this
        machine whose ``local_dir`` no longer has it; False when nowhere else holds it (a directory
        is the durable home: a checkpoint missing there was pruned)."""

    def persist_checkpoint(self, checkpoint: Path, num_to_keep: int | None) -> None:
        """Make a checkpoint committed under ``local_dir`` durable, with rank 0's logs, and prune
        the durable copies to ``num_to_keep`` (a no-op for a directory)."""

    def commit_reported(self, staging: Path, dir_name: str) -> tuple[str, Any]:
        """Commit a checkpoint that Ray Train reports from ``staging``; return where Ray Train keeps
        it: a path and its pyarrow filesystem."""

    def checkpoint_storage(self) -> tuple[str, Any]:
        """Where Ray Train keeps the run's checkpoints: a path and its pyarrow filesystem (None: the
        local one)."""

    def persist_final(self, flush: Callable[[], None]) -> None:
        """Make ``final/`` and rank 0's logs durable at the end of the run, calling ``flush`` first
        (closing the metric loggers, so their last records are in the files); a no-op for a directory."""

    def pull_logs(self) -> None:
        """Give ``local_dir`` rank 0's logs as the durable home holds them, replacing what an earlier
        attempt left there (a no-op for a directory, which is the durable home itself)."""

    def drop_local_copy(self) -> None:
        """Delete ``local_dir`` once the durable home holds the whole finished run (a no-op for a
        directory, which is the durable home itself)."""


class LocalRunStore:
    """A run in a local (or mounted) directory."""

    shown_uri: str | None = None
    can_replace = True

    def __init__(self, run_dir: Path) -> None:
        self.location = RunLocation(run_dir)
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

    def checkpoint_manifest(self, name: str) -> Manifest | None:
        """The manifest of a checkpoint of the directory."""
        return read_manifest(self.local_dir / layout.CHECKPOINTS_DIR / name)

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

    def finished(self) -> bool:
        """Whether the directory has a ``final/``."""
        return (self.local_dir / layout.FINAL_DIR).is_dir()

    def checkpoints(self) -> list[CheckpointInfo]:
        """The checkpoints of the directory."""
        return scan_checkpoints(self.local_dir / layout.CHECKPOINTS_DIR)

    def where_of(self, rel: str) -> str:
        """The path in the directory."""
        return str(self.local_dir / rel)

    def latest_checkpoint(self, reported: Path | None = None) -> Path | None:
        """The newest checkpoint of the directory that verifies; with ``reported``, the newer of it
        and the newest complete one (Ray learns of a committed checkpoint a moment after the
        rename: a worker killed in that moment must not redo the steps of a checkpoint on storage)."""
        root = self.local_dir / layout.CHECKPOINTS_DIR
        if reported is None:
            return latest_valid_checkpoint(root)
        newest = choose_resume(scan_checkpoints(root))
        reported_step = layout.parse_step_dir_name(reported.name)
        if newest is not None and reported_step is not None and newest.step > reported_step:
            log.info("resuming from %s, newer than %s that Ray handed back", root / newest.name, reported)
            return root / newest.name
        return reported

    def copy_checkpoint(self, name: str, dest: Path) -> bool:
        """Nothing to copy from: the directory is the run."""
        return False

    def persist_checkpoint(self, checkpoint: Path, num_to_keep: int | None) -> None:
        """Nothing to do: the checkpoint is in the run directory, pruned there."""

    def commit_reported(self, staging: Path, dir_name: str) -> tuple[str, Any]:
        """Rename the staging directory into place: Ray Train's "upload", so storage never holds a
        half-copied ``step-N/``."""
        from pyarrow import fs

        target = self.local_dir / layout.CHECKPOINTS_DIR / dir_name
        publish_checkpoint(staging, target)
        return str(target), fs.LocalFileSystem()

    def checkpoint_storage(self) -> tuple[str, Any]:
        """The run directory."""
        return str(self.local_dir), None

    def persist_final(self, flush: Callable[[], None]) -> None:
        """Nothing to do: final/ is in the run directory (the loggers close at the end of the loop)."""

    def pull_logs(self) -> None:
        """Nothing to do: rank 0 appends to the run directory's logs."""

    def drop_local_copy(self) -> None:
        """Nothing to do: the directory is the run."""


class RemoteRunStore:
    """A run at a URI, written through a local mirror that starts empty (a cache of the remote run)."""

    can_replace = False

    def __init__(self, remote: RemoteRun, location: RunLocation) -> None:
        self.location = location
        self.local_dir = location.local_dir
        self.remote = remote
        self.where = remote.where.partition("?")[0]
        self.shown_uri: str | None = remote.where

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

    def checkpoint_manifest(self, name: str) -> Manifest | None:
        """The manifest of a checkpoint under the URI."""
        return self.remote.manifest(f"{layout.CHECKPOINTS_DIR}/{name}")

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
        log.info("run stored at %s (local mirror %s)", self.remote.where, self.local_dir)

    def finished(self) -> bool:
        """Whether the URI holds a ``final/`` with its manifest (uploaded last)."""
        return self.remote.is_file(f"{layout.FINAL_DIR}/{layout.MANIFEST_FILE}")

    def checkpoints(self) -> list[CheckpointInfo]:
        """The checkpoints under the URI (complete once their manifest is there)."""
        return self.remote.scan_checkpoints()

    def where_of(self, rel: str) -> str:
        """The masked URI of the path."""
        return self.remote.uri_of(rel)

    def latest_checkpoint(self, reported: Path | None = None) -> Path | None:
        """The newest complete checkpoint under the URI that verifies, downloaded into
        ``local_dir/checkpoints`` (once per node: its ranks take turns). Every checkpoint Ray
        knows of was uploaded complete before it was reported, so ``reported`` is never newer."""
        with node_lock(self.local_dir / DOWNLOAD_LOCK):  # released before the ranks meet in collectives
            return self.remote.download_latest_checkpoint(self.local_dir / layout.CHECKPOINTS_DIR)

    def copy_checkpoint(self, name: str, dest: Path) -> bool:
        """Download the checkpoint from under the URI."""
        self.remote.download_tree(f"{layout.CHECKPOINTS_DIR}/{name}", dest)
        return True

    def persist_checkpoint(self, checkpoint: Path, num_to_keep: int | None) -> None:
        """Upload the checkpoint (manifest last) and rank 0's logs, then prune under the URI."""
        sync_checkpoint(self.remote, checkpoint, self.local_dir, num_to_keep)

    def commit_reported(self, staging: Path, dir_name: str) -> tuple[str, Any]:
        """Upload the staging directory to the URI (manifest last) with rank 0's logs, and keep it
        on this node as the only local checkpoint (a restart here needs no download); Ray Train,
        whose storage is the URI, prunes there."""
        self.remote.upload_tree(staging, f"{layout.CHECKPOINTS_DIR}/{dir_name}")
        self.remote.upload_logs(self.local_dir)
        keep_only_newest(staging, self.local_dir / layout.CHECKPOINTS_DIR / dir_name)
        filesystem, path = self.remote.checkpoint_location(dir_name)
        return path, filesystem

    def checkpoint_storage(self) -> tuple[str, Any]:
        """The run's path in its pyarrow filesystem (so that no credential is part of a path Ray
        shows), which every node reaches."""
        return self.remote.root, self.remote.filesystem

    def persist_final(self, flush: Callable[[], None]) -> None:
        """Flush the loggers, then upload final/ (manifest last) and rank 0's logs."""
        flush()
        self.remote.upload_final(self.local_dir)

    def pull_logs(self) -> None:
        """Replace rank 0's logs (and a final/) that an earlier attempt left on this node with the
        logs the URI holds (the steps up to the last uploaded checkpoint)."""
        for rel in (*WORKER_LOGS, layout.FINAL_DIR):
            path = self.local_dir / rel
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        self.remote.download_logs(self.local_dir, WORKER_LOGS)

    def drop_local_copy(self) -> None:
        """Delete ``local_dir`` once final/ is uploaded from it: the URI holds the whole run."""
        if (self.local_dir / layout.FINAL_DIR / layout.MANIFEST_FILE).is_file():
            shutil.rmtree(self.local_dir, ignore_errors=True)


DOWNLOAD_LOCK = ".checkpoint-download.lock"
"""The lock file, in a worker's directory, that makes the ranks of one node download a checkpoint once."""


def open_store(location: RunLocation) -> RunStore:
    """The store of a run at ``location``."""
    if location.remote_uri is None:
        return LocalRunStore(location.local_dir)
    return RemoteRunStore(RemoteRun(location.remote_uri), location)


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


def download_dir_once(uri: str, target: Path) -> int:
    """Every file under the remote directory ``uri`` into ``target`` (relative to the URI itself), through a
    staging directory renamed into place, so that processes of one machine downloading the same URI at once
    publish one copy (the first rename wins); the number of files listed (0: nothing was written).

    Raises:
        StorageError: the URI cannot be listed or read.
    """
    from rayft.files import publish_dir_once, staging_dir

    remote = RemoteRun(uri)
    names = remote.list_files("")
    if not names:
        return 0
    staging = staging_dir(target)
    for name in names:
        remote.download_file(name, staging / name)  # download_tree("") would name them from the bucket's root
    publish_dir_once(staging, target)
    return len(names)
