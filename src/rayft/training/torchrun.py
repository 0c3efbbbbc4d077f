"""Running the per-worker loop under ``torchrun`` (or any launcher that sets RANK/WORLD_SIZE).

The loop, the shard plan and the checkpoint format are the same as on Ray Train, so a run can be
benchmarked against plain torch.distributed, or launched by a Kubeflow PyTorchJob::

    torchrun --nproc_per_node 2 -m rayft.training.torchrun PLAN.json

where PLAN.json is written by :func:`write_plan` (the benchmarks do this).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config import CheckpointConfig, LoggingConfig, LoraConfig, ModelConfig, TrainConfig
from rayft.runs import layout
from rayft.runs.checkpoints import latest_valid_checkpoint, prune_checkpoints, publish_checkpoint
from rayft.training.batches import Unit
from rayft.training.plan import Schedule
from rayft.training.session import staging_path
from rayft.training.shards import iter_windows, parquet_row_counts, plan_shards, read_shard_tables
from rayft.training.worker import run_worker
from rayft.training.worker_plan import WorkerPlan

if TYPE_CHECKING:
    import torch


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
        """This rank's planned shard of ``split``, in order."""
        files = list(self._files.get(split, ()))
        ranges = plan_shards(parquet_row_counts(files), self.world_size)[self.rank]
        return iter_windows(read_shard_tables(files, ranges), window_size)

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


def write_plan(path: Path, plan: WorkerPlan, files: Mapping[str, Sequence[str]]) -> None:
    """Save a worker plan and its split files as JSON for :func:`main`."""
    sections = {name: getattr(plan, name).model_dump(mode="json") for name in _SECTIONS}
    payload = {
        **sections,
        "seed": plan.seed,
        "run_dir": plan.run_dir,
        "resolved_config": plan.resolved_config,
        "schedule": asdict(plan.schedule),
        "shuffle_window": plan.shuffle_window,
        "has_validation": plan.has_validation,
        "lineage": plan.lineage,
        "files": {k: list(v) for k, v in files.items()},
    }
    path.write_text(json.dumps(payload, indent=2))


_SECTIONS: dict[str, Any] = {
    "model": ModelConfig,
    "lora": LoraConfig,
    "train": TrainConfig,
    "logging": LoggingConfig,
    "checkpoint": CheckpointConfig,
}


def read_plan(path: Path) -> tuple[WorkerPlan, dict[str, list[str]]]:
    """Load what :func:`write_plan` saved."""
    raw = json.loads(path.read_text())
    sections = {name: cls.model_validate(raw[name]) for name, cls in _SECTIONS.items()}
    plan = WorkerPlan(
        **sections,
        seed=raw["seed"],
        run_dir=raw["run_dir"],
        resolved_config=raw["resolved_config"],
        schedule=Schedule(**raw["schedule"]),
        shuffle_window=raw["shuffle_window"],
        has_validation=raw["has_validation"],
        lineage=raw["lineage"],
    )
    return plan, raw["files"]


def main(argv: Sequence[str] | None = None) -> None:
    """``torchrun ... -m rayft.training.torchrun PLAN.json``: run one rank of the plan."""
    import torch.distributed as dist

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: torchrun [torchrun options] -m rayft.training.torchrun PLAN.json")
    plan, files = read_plan(Path(args[0]))
    session = TorchrunSession(files, Path(plan.run_dir), num_to_keep=plan.checkpoint.num_to_keep)
    try:
        run_worker(plan, session)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
