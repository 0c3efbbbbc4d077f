"""The seam between the per-worker training loop and whatever runs it.

:class:`RaySession` runs under Ray Train (each worker reads its planned rows of the prepared files
itself, checkpoints go through ``ray.train.report``); :class:`LocalSession` runs in the calling
process without Ray (the ``num_workers: 0`` mode, and GPU machines without Ray). The loop sees only
:class:`TrainSession`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from rayft.runs import layout
from rayft.runs.checkpoints import latest_valid_checkpoint, prune_checkpoints, publish_checkpoint
from rayft.runs.location import RunLocation
from rayft.runs.store import open_store
from rayft.training.loop.batches import Unit
from rayft.training.loop.shards import check_readable, iter_rank_tables, iter_windows

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

T = TypeVar("T")


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


def take_means(sums: dict[str, float], names: Sequence[str], device: torch.device, count: float) -> dict[str, float]:
    """Every worker's ``sums`` of ``names`` (0 for a name not summed yet), as means over ``count`` (every
    worker's), then ``sums`` cleared: a method's figures since its last report."""
    totals = all_reduce_sum([float(sums.get(name, 0.0)) for name in names], device)
    sums.clear()
    return {name: total / max(count, 1.0) for name, total in zip(names, totals, strict=True)}


def all_gather_objects(obj: T) -> list[T]:
    """Every worker's ``obj``, in rank order (``[obj]`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return cast("list[T]", gathered)  # every rank's obj


class LocalSession:
    """Runs the loop in this process: parquet files read with pyarrow, checkpoints copied to storage."""

    def __init__(
        self,
        files: Mapping[str, Sequence[str]],
        location: RunLocation,
        *,
        num_to_keep: int | None = None,
        device: str | None = None,
    ) -> None:
        import torch

        self._files = files
        self._run_dir = location.local_dir
        self._num_to_keep = num_to_keep
        self._store = open_store(location)
        chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if chosen.type == "cuda" and chosen.index is None:
            # The loop pins its GPU with torch.cuda.set_device, which refuses a device without an index.
            chosen = torch.device("cuda", torch.cuda.current_device())
        self._device = chosen

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
        """Every row of the split's parquet files in order, ``window_size`` rows at a time, read one
        row group at a time."""
        return iter_windows(iter_rank_tables(list(self._files.get(split, ())), 0, 1), window_size)

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        """The latest complete checkpoint under the run's checkpoints/ directory, if any; with a
        remote ``storage_path``, the newest remote one that verifies, downloaded there first."""
        yield self._store.latest_checkpoint()

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
        self._store.persist_checkpoint(target, self._num_to_keep)


class RaySession:
    """Runs under Ray Train V2: one of ``world_size`` workers of a TorchTrainer.

    ``files`` are the prepared parquet files of each split, which this worker reads its own rows of
    (they must be where every node reads them: the data cache on a file system all nodes mount).
    With a local ``storage_path`` (a directory every node sees) the workers write into the run
    directory. With a URI, ``location.local_dir`` is this worker's own directory on its node
    (:func:`rayft.runs.location.worker_dir`), never the driver's mirror: rank 0 writes its
    checkpoints, logs and final/ there and uploads them (manifest last); a resuming worker downloads
    the checkpoint into it (once per node); Ray Train keeps the run's checkpoints under the URI.
    """

    def __init__(
        self,
        files: Mapping[str, Sequence[str]],
        location: RunLocation,
        *,
        num_to_keep: int | None = None,
    ) -> None:
        import ray.train

        self._context = ray.train.get_context()
        check_readable(files, self.rank)
        self._files = files
        self._run_dir = location.local_dir
        self._store = open_store(location)
        self._num_to_keep = num_to_keep
        if self.rank == 0:
            self._store.pull_logs()

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
        """This worker's shard of ``split`` (planned by
        :func:`~rayft.training.loop.shards.plan_shards`), in order, read by this worker from the
        prepared files one row group at a time and cut into windows exactly as without Ray."""
        files = list(self._files.get(split, ()))
        return iter_windows(iter_rank_tables(files, self.rank, self.world_size), window_size)

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        """The newest of the checkpoint Ray hands a restarted worker and the newest complete one on
        storage (:meth:`rayft.runs.store.RunStore.latest_checkpoint`). Only the path of Ray's
        checkpoint is read: on a URI, Ray would download the whole of it to every rank."""
        import ray.train

        reported = ray.train.get_checkpoint()
        yield self._store.latest_checkpoint(None if reported is None else Path(reported.path))

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

        def commit(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
            path, filesystem = self._store.commit_reported(Path(checkpoint.path), dir_name)
            return Checkpoint(path, filesystem=filesystem)

        ray.train.report(
            metrics,
            checkpoint=Checkpoint.from_directory(str(staging)),
            checkpoint_dir_name=layout.step_dir_name(step),
            checkpoint_upload_fn=commit,
            delete_local_checkpoint_after_upload=False,
        )


class TorchrunSession:
    """One process of a torch.distributed job: gloo on CPU, nccl on GPU, DDP, shared storage."""

    def __init__(self, files: Mapping[str, Sequence[str]], run_dir: Path, *, num_to_keep: int | None) -> None:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._device = torch.device(f"cuda:{self._local_rank}" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(self._device)
        check_readable(files, self.rank)
        self._files = files
        self._run_dir = run_dir
        self._num_to_keep = num_to_keep

    @property
    def rank(self) -> int:
        """Global rank from torch.distributed."""
        import torch.distributed as dist

        return dist.get_rank()

    @property
    def world_size(self) -> int:
        """World size from torch.distributed."""
        import torch.distributed as dist

        return dist.get_world_size()

    @property
    def device(self) -> torch.device:
        """This process's GPU (LOCAL_RANK) or the CPU."""
        return self._device

    def windows(self, split: str, window_size: int) -> Iterator[list[Unit]]:
        """This rank's planned shard of ``split``, in order, read by this rank one row group at a time."""
        files = list(self._files.get(split, ()))
        return iter_windows(iter_rank_tables(files, self.rank, self.world_size), window_size)

    @contextlib.contextmanager
    def restored_checkpoint(self) -> Iterator[Path | None]:
        """The newest complete checkpoint on the shared storage."""
        yield latest_valid_checkpoint(self._run_dir / layout.CHECKPOINTS_DIR)

    def staging_dir(self, step: int) -> Path:
        """A hidden directory beside the checkpoint's final place on the shared storage."""
        return staging_path(self._run_dir / layout.CHECKPOINTS_DIR, step)

    def commit_checkpoint(self, metrics: dict[str, float], staging: Path | None, step: int) -> None:
        """Rank 0 (which wrote every rank's files) renames the staging directory into place."""
        if staging is None:
            return
        root = self._run_dir / layout.CHECKPOINTS_DIR
        publish_checkpoint(staging, root / layout.step_dir_name(step))
        prune_checkpoints(root, self._num_to_keep)


def staging_path(root: Path, step: int) -> Path:
    """The staging directory of the checkpoint of ``step`` under ``root`` (hidden, per process)."""
    return root / f".{layout.step_dir_name(step)}.partial-{os.getpid()}"


def remove_dir(path: Path) -> None:
    """Delete a directory tree, ignoring a missing one."""
    shutil.rmtree(path, ignore_errors=True)
