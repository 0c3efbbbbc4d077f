"""A run's durable home at a URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``: any filesystem
``pyarrow.fs.FileSystem.from_uri`` opens), kept in step with the local mirror training writes into.

Object stores have no rename, so a checkpoint cannot be committed remotely the way it is locally.
Instead every file is uploaded first and the manifest (``rayft_checkpoint.json``) last: a remote
checkpoint without a manifest is incomplete, is never downloaded, and is removed on the next
``--resume``, exactly like a local staging directory. A downloaded checkpoint is checked against
its manifest (sizes and sha256) before it is used; a corrupted one is skipped with a warning.

Which checkpoint to resume from and which to delete is decided by :mod:`rayft.runs.selection`.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rayft.errors import CheckpointError, StorageError
from rayft.files import replace_dir, temp_path
from rayft.runs import layout
from rayft.runs.checkpoints import publish_checkpoint
from rayft.runs.location import join_uri
from rayft.runs.manifest import Manifest, verify_checkpoint
from rayft.runs.planner import RunState
from rayft.runs.selection import CheckpointInfo, plan_cleanup, plan_retention, set_aside_name
from rayft.security import mask_uri

log = logging.getLogger("rayft.train")

PROBE_FILE = ".rayft-write-probe"
"""The marker object written and deleted to check, before training, that the URI is writable."""

WORKER_LOGS = (layout.METRICS_FILE, layout.TENSORBOARD_DIR, layout.TRACKING_UNSENT_FILE, layout.PROFILE_DIR)
"""What rank 0 writes besides checkpoints and final/, uploaded at each checkpoint and at the end."""
LOG_PATHS = (*WORKER_LOGS, layout.DATA_DIR)
"""What of the run directory besides checkpoints a resumed run fetches (``data/`` is the driver's)."""


class RemoteRun:
    """The files of one run under a URI: upload, download, list and delete, paths relative to the run."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs

        self.where = mask_uri(uri)
        try:
            self._fs, self._root = fs.FileSystem.from_uri(uri)
        except (ValueError, OSError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) for unknown schemes
            raise StorageError(
                f"storage_path {self.where}: pyarrow cannot open this URI ({_reason(exc)}); use a scheme it "
                "supports (s3://, gs://, hdfs://, file://) with its filesystem installed, or a local directory"
            ) from None
        self._root = self._root.rstrip("/")

    @classmethod
    def on_filesystem(cls, filesystem: Any, root: str, where: str) -> RemoteRun:
        """A run at ``root`` of an already open ``pyarrow.fs.FileSystem`` (a custom or wrapped one);
        ``where`` names it in messages."""
        run = cls.__new__(cls)
        run._fs, run._root, run.where = filesystem, root.rstrip("/"), mask_uri(where)
        return run

    def _path(self, rel: str) -> str:
        return f"{self._root}/{rel}" if rel else self._root

    def uri_of(self, rel: str) -> str:
        """The masked URI of a path of the run, for messages."""
        return join_uri(self.where, rel) if rel else self.where

    # --- checks and small files ----------------------------------------------------------------------------

    def probe(self) -> None:
        """Write and delete a small marker object; a StorageError says why the URI cannot be used."""
        marker = self._path(f"{PROBE_FILE}-{os.getpid()}")
        try:
            self._fs.create_dir(self._root, recursive=True)
            with self._fs.open_output_stream(marker) as handle:
                handle.write(b"rayft write probe\n")
            self._fs.delete_file(marker)
        except (OSError, ValueError) as exc:
            raise StorageError(
                f"storage_path {self.where}: cannot write there ({_reason(exc)}). Check that the bucket exists, that "
                "credentials are set (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS...) "
                "and allow writing, or use a local directory or shared mount as storage_path"
            ) from None

    def read_text(self, rel: str) -> str | None:
        """The text of a file of the run, or None if it does not exist."""
        if not self.is_file(rel):
            return None
        with self._fs.open_input_stream(self._path(rel)) as handle:
            return bytes(handle.read()).decode("utf-8")

    def write_text(self, rel: str, text: str) -> None:
        """Write a small file of the run (replacing what was there)."""
        target = self._path(rel)
        self._fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with self._fs.open_output_stream(target) as sink:
            sink.write(text.encode("utf-8"))

    def checkpoint_location(self, name: str) -> tuple[Any, str]:
        """The pyarrow filesystem and the path in it of the checkpoint folder ``name`` (what a Ray
        Train ``Checkpoint`` is made of)."""
        return self._fs, self._path(f"{layout.CHECKPOINTS_DIR}/{name}")

    @property
    def filesystem(self) -> Any:
        """The run's pyarrow filesystem (credentials inside; never shown)."""
        return self._fs

    @property
    def root(self) -> str:
        """The run's path in :attr:`filesystem` (no scheme, no credentials)."""
        return str(self._root)

    def is_file(self, rel: str) -> bool:
        """Whether a file of the run exists."""
        from pyarrow import fs

        return bool(self._fs.get_file_info(self._path(rel)).type == fs.FileType.File)

    def upload_file(self, local: Path, rel: str) -> None:
        """Copy one local file to the run (replacing what was there)."""
        target = self._path(rel)
        self._fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with open(local, "rb") as source, self._fs.open_output_stream(target) as sink:
            shutil.copyfileobj(source, sink, 1 << 20)

    def download_file(self, rel: str, local: Path) -> None:
        """Copy one file of the run to ``local``."""
        local.parent.mkdir(parents=True, exist_ok=True)
        with self._fs.open_input_stream(self._path(rel)) as source, open(local, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)

    def list_files(self, rel: str) -> list[str]:
        """Every file under a folder of the run, as paths relative to that folder (empty if none)."""
        from pyarrow import fs

        base = self._path(rel)
        selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
        infos = self._fs.get_file_info(selector)
        return sorted(i.path[len(base) + 1 :] for i in infos if i.type == fs.FileType.File)

    def delete(self, rel: str) -> None:
        """Delete a folder (or file) of the run; a missing one is ignored."""
        from pyarrow import fs

        info = self._fs.get_file_info(self._path(rel))
        if info.type == fs.FileType.Directory:
            self._fs.delete_dir(self._path(rel))
        elif info.type == fs.FileType.File:
            self._fs.delete_file(self._path(rel))

    # --- trees: the manifest last --------------------------------------------------------------------------

    def upload_tree(self, local: Path, rel: str) -> None:
        """Upload a local folder to ``rel``, replacing it; a manifest inside is uploaded last, after
        the old one is deleted first, so the remote folder is complete only once every file is there."""
        self.delete(rel)
        files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        for name in [f for f in files if f != layout.MANIFEST_FILE]:
            self.upload_file(local / name, f"{rel}/{name}")
        if layout.MANIFEST_FILE in files:
            self.upload_file(local / layout.MANIFEST_FILE, f"{rel}/{layout.MANIFEST_FILE}")

    def download_tree(self, rel: str, local: Path) -> None:
        """Download a folder of the run into ``local`` (replacing it)."""
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        for name in self.list_files(rel):
            self.download_file(f"{rel}/{name}", local / name)

    # --- run state and checkpoints ------------------------------------------------------------------------

    def manifest(self, rel: str) -> Manifest | None:
        """The manifest of a remote checkpoint folder, or None if it is missing or unreadable."""
        text = self.read_text(f"{rel}/{layout.MANIFEST_FILE}")
        if text is None:
            return None
        try:
            return Manifest.from_json(text)
        except (ValueError, KeyError, TypeError):
            return None

    def scan_checkpoints(self) -> list[CheckpointInfo]:
        """Every remote ``step-*`` folder, complete when its manifest is there (oldest first)."""
        from pyarrow import fs

        base = self._path(layout.CHECKPOINTS_DIR)
        selector = fs.FileSelector(base, recursive=False, allow_not_found=True)
        infos = []
        for info in self._fs.get_file_info(selector):
            step = layout.parse_step_dir_name(info.base_name)
            if step is None or info.type != fs.FileType.Directory:
                continue
            rel = f"{layout.CHECKPOINTS_DIR}/{info.base_name}"
            manifest = self.manifest(rel)
            loss = manifest.metrics.get("eval/loss") if manifest else None
            unreadable = manifest is None and self.is_file(f"{rel}/{layout.MANIFEST_FILE}")
            infos.append(CheckpointInfo(info.base_name, step, manifest is not None, loss, unreadable=unreadable))
        return sorted(infos, key=lambda c: c.step)

    def run_state(self) -> RunState:
        """What is stored of the run (read before it is started or resumed)."""
        steps = tuple(c.step for c in self.scan_checkpoints() if c.complete)
        finished = self.is_file(f"{layout.FINAL_DIR}/{layout.MANIFEST_FILE}")
        logged = self.is_file(layout.METRICS_FILE)
        return RunState(self.is_file(layout.CONFIG_FILE), finished, steps, logged)

    def upload_checkpoint(self, local: Path) -> None:
        """Upload a committed local checkpoint folder (``checkpoints/step-N``), manifest last."""
        self.upload_tree(local, f"{layout.CHECKPOINTS_DIR}/{local.name}")

    def remove_incomplete(self) -> list[str]:
        """Delete remote checkpoints without a manifest (an upload that did not finish); return their names.
        One whose manifest is there but cannot be read was committed: it is set aside, never deleted."""
        plan = plan_cleanup(self.scan_checkpoints())
        for info in plan.set_aside:
            self.set_aside(info.name)
        doomed = [c.name for c in plan.remove]
        for name in doomed:
            log.warning("Removing incomplete checkpoint %s (its upload did not finish)", self.uri_of(name))
            self.delete(f"{layout.CHECKPOINTS_DIR}/{name}")
        return doomed

    def set_aside(self, name: str) -> str:
        """Copy a committed checkpoint whose manifest cannot be read to ``step-N.unreadable`` (every file,
        the manifest last), then delete the original: out of every reader's sight, never lost."""
        from pyarrow import fs

        base = self._path(layout.CHECKPOINTS_DIR)
        taken = {i.base_name for i in self._fs.get_file_info(fs.FileSelector(base, allow_not_found=True))}
        target = f"{layout.CHECKPOINTS_DIR}/{set_aside_name(name, taken)}"
        files = self.list_files(f"{layout.CHECKPOINTS_DIR}/{name}")
        for rel in sorted(files, key=lambda f: f == layout.MANIFEST_FILE):
            self._fs.create_dir(self._path(f"{target}/{rel}").rsplit("/", 1)[0], recursive=True)
            self._fs.copy_file(self._path(f"{layout.CHECKPOINTS_DIR}/{name}/{rel}"), self._path(f"{target}/{rel}"))
        self.delete(f"{layout.CHECKPOINTS_DIR}/{name}")
        log.warning(
            "Checkpoint %s has a %s that cannot be read, so its upload was committed but it cannot be verified; "
            "set aside as %s (kept, never deleted) and resuming from the checkpoint before it",
            self.uri_of(f"{layout.CHECKPOINTS_DIR}/{name}"), layout.MANIFEST_FILE, self.uri_of(target),
        )  # fmt: skip
        return target

    def prune(self, num_to_keep: int | None) -> list[str]:
        """Delete the remote checkpoints :func:`plan_retention` marks as surplus; return their names."""
        doomed = [c.name for c in plan_retention(self.scan_checkpoints(), num_to_keep)]
        for name in doomed:
            self.delete(f"{layout.CHECKPOINTS_DIR}/{name}")
        return doomed

    def download_latest_checkpoint(self, local_root: Path) -> Path | None:
        """Download the newest complete remote checkpoint whose files match its manifest into
        ``local_root``; a corrupted one is skipped with a warning naming the bad files.

        Raises:
            CheckpointError: when complete checkpoints exist but none verifies.
        """
        complete = [c for c in self.scan_checkpoints() if c.complete]
        for info in reversed(complete):
            rel = f"{layout.CHECKPOINTS_DIR}/{info.name}"
            if self._same_as_local(rel, local_root / info.name):
                log.info("checkpoint %s is already at %s", self.uri_of(rel), local_root / info.name)
                return local_root / info.name
            staging = local_root / f".{info.name}.download-{os.getpid()}"
            self.download_tree(rel, staging)
            problems = verify_checkpoint(staging)
            if not problems:
                target = local_root / info.name
                publish_checkpoint(staging, target)
                log.info("downloaded checkpoint %s to %s", self.uri_of(rel), target)
                return target
            shutil.rmtree(staging, ignore_errors=True)
            log.warning("Skipping checkpoint %s: %s", self.uri_of(rel), "; ".join(problems))
        if complete:
            raise CheckpointError(
                f"no usable checkpoint to resume from under {self.uri_of(layout.CHECKPOINTS_DIR)}: every one failed "
                "verification (the warnings above name the bad files). Restore the files, or delete the run "
                f"{self.where} to start it over."
            )
        return None

    def _same_as_local(self, rel: str, local: Path) -> bool:
        """Whether ``local`` is a published copy of the remote folder ``rel`` (the same manifest:
        published local copies were verified before they were renamed into place)."""
        manifest = local / layout.MANIFEST_FILE
        if not manifest.is_file():
            return False
        return manifest.read_text(encoding="utf-8") == self.read_text(f"{rel}/{layout.MANIFEST_FILE}")

    # --- the rest of the run directory ---------------------------------------------------------------------

    def upload_logs(self, run_dir: Path, paths: tuple[str, ...] = WORKER_LOGS) -> None:
        """Upload ``paths`` of the local run directory (what exists of them; by default rank 0's logs)."""
        for rel in paths:
            path = run_dir / rel
            if path.is_file():
                self.upload_file(path, rel)
            elif path.is_dir():
                for file in sorted(p for p in path.rglob("*") if p.is_file()):
                    self.upload_file(file, f"{rel}/{file.relative_to(path).as_posix()}")

    def download_logs(self, run_dir: Path, paths: tuple[str, ...] = LOG_PATHS) -> None:
        """Download ``paths`` (what exists of them) into the local run directory."""
        for rel in paths:
            if self.is_file(rel):
                self.download_file(rel, run_dir / rel)
                continue
            for name in self.list_files(rel):
                self.download_file(f"{rel}/{name}", run_dir / rel / name)

    def upload_final(self, run_dir: Path) -> None:
        """Upload final/ (manifest last) and the logs at the end of the run."""
        self.upload_logs(run_dir)
        self.upload_tree(run_dir / layout.FINAL_DIR, layout.FINAL_DIR)
        log.info("uploaded %s", self.uri_of(layout.FINAL_DIR))

    def download_results(self, run_dir: Path) -> None:
        """Bring what the workers uploaded at the end (final/, rank 0's logs) into a local run
        directory that did not write them (the driver's mirror); a final/ already there with the
        same manifest is kept."""
        self.download_logs(run_dir, WORKER_LOGS)
        final = run_dir / layout.FINAL_DIR
        uploaded = self.is_file(f"{layout.FINAL_DIR}/{layout.MANIFEST_FILE}")
        if not uploaded or self._same_as_local(layout.FINAL_DIR, final):
            return
        staging = temp_path(final, "download")
        shutil.rmtree(staging, ignore_errors=True)
        self.download_tree(layout.FINAL_DIR, staging)
        replace_dir(staging, final)
        log.info("downloaded %s to %s", self.uri_of(layout.FINAL_DIR), final)


def sync_checkpoint(remote: RemoteRun, checkpoint: Path, run_dir: Path, num_to_keep: int | None) -> None:
    """After a local commit: upload the checkpoint (manifest last) and the logs, then prune remotely."""
    remote.upload_checkpoint(checkpoint)
    remote.upload_logs(run_dir)
    remote.prune(num_to_keep)
    log.info("uploaded %s", remote.uri_of(f"{layout.CHECKPOINTS_DIR}/{checkpoint.name}"))


def _reason(exc: BaseException) -> str:
    """The first line of a pyarrow error, with credentials masked."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return mask_uri(text)
