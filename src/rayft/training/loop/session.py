"""The seam between the per-worker training loop and whatever runs it.

:class:`RaySession` runs under Ray Train (data from ``get_dataset_shard``, checkpoints through
``ray.train.report``); :class:`LocalSession` runs in the calling process without Ray (the
``num_workers: 0`` mode, and GPU machines without Ray). The loop sees only :class:`TrainSession`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rayft.runs import layout
from rayft.runs.checkpoints import (
    latest_valid_checkpoint,
    prune_checkpoints,
    publish_checkpoint,
    scan_checkpoints,
)
from rayft.runs.remote import WORKER_LOGS, RemoteRun, sync_checkpoint
from rayft.runs.selection import choose_resume
from rayft.training.loop.batches import Unit
from rayft.training.loop.shards import iter_windows, parquet_row_counts, plan_shards, read_shard_tables

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class TrainSession(Protocol):
    """What the training loop needs from its runtime."""

    @property
    def rank(self) -> int:
        """This worker's global rank."""
        ...

    @property
    def world_size(self) -> int:
        """Number of workers."""
        ...

    @property
    def device(self) -> torch.device:
        """The device this worker trains on."""
        ...

    def windows(self, split: str, window_size: int) -> Iterator[list[Unit]]:
        """One pass over this worker's units of ``split``, in storage order, in windows."""
        ...

    def restored_checkpoint(self) -> contextlib.AbstractContextManager[Path | None]:
        """The checkpoint to resume from, as a local directory (None on a fresh start)."""
        ...

    def staging_dir(self, step: int) -> Path:
        """Where rank 0 writes the checkpoint of ``step`` before it is committed."""
        ...

    def commit_checkpoint(self, metrics: dict[str, float], staging: Path | None, step: int) -> None:
        """Make the checkpoint written to ``staging`` the one of ``step`` (every rank calls this;
        ``staging`` is None on all but rank 0). May run in a background thread: no collectives."""
        ...


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Sum ``values`` over all workers (identity without a process group). Float64 keeps token
    counts exact."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [float(v) for v in values]
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.tolist()]


def all_gather_objects(obj: Any) -> list[Any]:
    """Every worker's ``obj``, in rank order (``[obj]`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


class LocalSession:
    """Runs the loop in this process: parquet files read with pyarrow, checkpoints copied to storage."""

    def __init__(
        self,
        files: Mapping[str, Sequence[str]],
        run_dir: Path,
        *,
        num_to_keep: int | None = None,
        device: str | None = None,
        remote_uri: str | None = None,
    ) -> None:
        import torch

        self._files = files
        self._run_dir = run_dir
        self._num_to_keep = num_to_keep
        self._remote = RemoteRun(remote_uri) if remote_uri else None
        self._cache: dict[str, list[Any]] = {}
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def rank(self) -> int:
        """Always 0: one worker."""
        return 0

    @property
    def world_size(self) -> int:
        """Always 1: one worker."""
        return 1

    @property
    def device(self) -> torch.device:
        """CUDA when available, else CPU (unless given)."""
        return self._device

    def windows(self, split: str, window_size: int) -> Iterator[list[Unit]]:
        """Every row of the split's parquet files in order, ``window_size`` rows at a time."""
        return iter_windows(self._tables(split), window_size)

    def _tables(self, split: str) -> list[Any]:
        if split not in self._cache:
            files = list(self._files.get(split, ()))
            ranges = plan_shards(parquet_row_counts(files), 1)[0]
            self._cache[split] = read_shard_tables(files, ranges)
        return self._cache[split]

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        """The latest complete checkpoint under the run's checkpoints/ directory, if any; with a
        remote ``storage_path``, the newest remote one that verifies, downloaded there first."""
        root = self._run_dir / layout.CHECKPOINTS_DIR
        if self._remote is not None:
            yield self._remote.download_latest_checkpoint(root)
            return
        yield latest_valid_checkpoint(root)

    def staging_dir(self, step: int) -> Path:
        """A hidden directory beside the checkpoint's final place (same filesystem: one rename)."""
        return staging_path(self._run_dir / layout.CHECKPOINTS_DIR, step)

    def commit_checkpoint(self, metrics: dict[str, float], staging: Path | None, step: int) -> None:
        """Rename the staging directory into place, then delete surplus checkpoints; with a remote
        ``storage_path``, upload it (manifest last) and prune there too."""
        if staging is None:
            return
        root = self._run_dir / layout.CHECKPOINTS_DIR
        target = root / layout.step_dir_name(step)
        publish_checkpoint(staging, target)
        prune_checkpoints(root, self._num_to_keep)
        if self._remote is not None:
            sync_checkpoint(self._remote, target, self._run_dir, self._num_to_keep)


class RaySession:
    """Runs under Ray Train V2: one of ``world_size`` workers of a TorchTrainer.

    With a local ``storage_path`` (a directory every node sees) the workers write into the run
    directory. With a URI, ``run_dir`` is this worker's own directory on its node
    (:func:`rayft.runs.location.worker_dir`), never the driver's mirror: rank 0 writes its
    checkpoints, logs and final/ there and uploads them (manifest last); a resuming worker downloads
    the checkpoint into it (once per node); Ray Train keeps the run's checkpoints under the URI.
    """

    def __init__(self, run_dir: Path, *, remote_uri: str | None = None, num_to_keep: int | None = None) -> None:
        import ray.train

        self._context = ray.train.get_context()
        self._run_dir = run_dir
        self._remote = RemoteRun(remote_uri) if remote_uri else None
        self._num_to_keep = num_to_keep
        if self._remote is not None and self.rank == 0:
            pull_worker_logs(self._remote, run_dir)

    @property
    def rank(self) -> int:
        """This worker's world rank."""
        return int(self._context.get_world_rank())

    @property
    def world_size(self) -> int:
        """Workers in the group."""
        return int(self._context.get_world_size())

    @property
    def device(self) -> torch.device:
        """The device Ray assigned to this worker."""
        import ray.train.torch

        return ray.train.torch.get_device()

    def windows(self, split: str, window_size: int) -> Iterator[list[Unit]]:
        """This worker's shard of ``split`` (planned by :func:`plan_shards`) from Ray Data, in order.

        Ray Data hands over whole blocks (one per planned file range, fetched ahead by one), and
        they are cut into windows here exactly as without Ray: Ray Data's per-batch cost (format
        conversion, the prefetch hand-off) is paid once per block instead of once per step.
        """
        import ray.train

        shard = ray.train.get_dataset_shard(split)
        blocks = shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=1)
        return iter_windows(blocks, window_size)

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        """The newest of the checkpoint Ray hands a restarted worker and the newest complete one on
        storage. Ray learns of a reported checkpoint a moment after it is committed; a worker killed
        in that moment must not redo the steps of a checkpoint that is already on storage."""
        import ray.train

        root = self._run_dir / layout.CHECKPOINTS_DIR
        if self._remote is not None:
            # Every checkpoint Ray knows of was uploaded complete before it was reported: the newest
            # complete one under the URI is at least as new. Ranks of one node download it once.
            with node_lock(self._run_dir / DOWNLOAD_LOCK):  # released before the ranks meet in collectives
                found = self._remote.download_latest_checkpoint(root)
            yield found
            return
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield latest_valid_checkpoint(root)
            return
        newest = choose_resume(scan_checkpoints(root))
        with checkpoint.as_directory() as directory:
            given = Path(directory)
            given_step = layout.parse_step_dir_name(given.name)
            if newest is not None and given_step is not None and newest.step > given_step:
                log.info("resuming from %s, newer than %s that Ray handed back", root / newest.name, given)
                yield root / newest.name
            else:
                yield given

    def staging_dir(self, step: int) -> Path:
        """A hidden directory beside the checkpoint's final place in the run directory (a local
        directory, a shared mount, or, with a URI, this worker's own directory on its node)."""
        return staging_path(self._run_dir / layout.CHECKPOINTS_DIR, step)

    def commit_checkpoint(self, metrics: dict[str, float], staging: Path | None, step: int) -> None:
        """Report the checkpoint to Ray Train; its "upload" is the rename of the staging directory
        into place, so storage never holds a half-copied ``step-N/``; with a remote ``storage_path``,
        the upload of the staging directory to the URI (manifest last) with rank 0's logs, and Ray
        Train, whose storage is the URI, prunes there. Ranks other than 0 report the metrics only
        (rank 0 wrote every rank's files)."""
        import ray.train
        from ray.train import Checkpoint

        if staging is None:
            ray.train.report(metrics, checkpoint_dir_name=layout.step_dir_name(step))
            return
        root = self._run_dir / layout.CHECKPOINTS_DIR
        remote = self._remote

        def upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
            assert remote is not None
            remote.upload_tree(Path(checkpoint.path), f"{layout.CHECKPOINTS_DIR}/{dir_name}")
            remote.upload_logs(self._run_dir)
            keep_only_newest(Path(checkpoint.path), root / dir_name)
            filesystem, path = remote.checkpoint_location(dir_name)
            return Checkpoint(path, filesystem=filesystem)

        def rename_into_place(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
            target = root / dir_name
            publish_checkpoint(Path(checkpoint.path), target)
            if self._remote is not None:
                sync_checkpoint(self._remote, target, self._run_dir, self._num_to_keep)
            return Checkpoint.from_directory(str(target))

        ray.train.report(
            metrics,
            checkpoint=Checkpoint.from_directory(str(staging)),
            checkpoint_dir_name=layout.step_dir_name(step),
            checkpoint_upload_fn=rename_into_place if remote is None else upload,
            delete_local_checkpoint_after_upload=False,
        )


DOWNLOAD_LOCK = ".checkpoint-download.lock"
"""The lock file, in a worker's directory, that makes the ranks of one node download a checkpoint once."""


@contextlib.contextmanager
def node_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) among the processes of this machine."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pull_worker_logs(remote: RemoteRun, run_dir: Path) -> None:
    """Give rank 0's directory the run's logs as the URI holds them (the steps up to the last
    uploaded checkpoint), replacing what an earlier attempt on this node left there."""
    for rel in (*WORKER_LOGS, layout.FINAL_DIR):
        path = run_dir / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    remote.download_logs(run_dir, WORKER_LOGS)


def keep_only_newest(staging: Path, target: Path) -> None:
    """Keep the checkpoint just uploaded on this node too (a restart here needs no download), in
    place of the older ones: the URI holds the run's checkpoints."""
    publish_checkpoint(staging, target)
    for info in scan_checkpoints(target.parent):
        if info.name != target.name:
            shutil.rmtree(target.parent / info.name, ignore_errors=True)


def staging_path(root: Path, step: int) -> Path:
    """The staging directory of the checkpoint of ``step`` under ``root`` (hidden, per process)."""
    return root / f".{layout.step_dir_name(step)}.partial-{os.getpid()}"


def remove_dir(path: Path) -> None:
    """Delete a directory tree, ignoring a missing one."""
    shutil.rmtree(path, ignore_errors=True)
