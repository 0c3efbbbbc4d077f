"""Running the per-worker loop under ``torchrun`` instead of Ray Train.

The loop, the shard plan and the checkpoint format are the same as on Ray Train. Two entries:

- ``torchrun --nproc-per-node 4 --no-python rayft train CONFIG``: `rayft train` started by torchrun
  (what the Kubeflow TrainJob and PyTorchJob of `rayft k8s render` run) trains as one rank of
  ``scaling.num_workers``: see :func:`train`. The run directory must be on storage every rank sees.
- ``torchrun --nproc_per_node 2 -m rayft.training.driver.torchrun PLAN.json`` runs a plan written by
  :func:`write_plan` (the benchmarks do this).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config import CheckpointConfig, LoggingConfig, LoraConfig, ModelConfig, RayftConfig, TrainConfig
from rayft.errors import ConfigError, RayftError
from rayft.runs.location import RunLocation
from rayft.training.driver.launcher import split_files, stop_on_sigterm
from rayft.training.driver.run import RunStart, drive
from rayft.training.driver.startup import prepare_training_data, run_location
from rayft.training.loop.plan import Schedule
from rayft.training.loop.session import TorchrunSession
from rayft.training.loop.worker import run_worker
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.methods.registry import REGISTERED

log = logging.getLogger("rayft.train")

if TYPE_CHECKING:
    from rayft.data.prepared import PreparedData
    from rayft.training.driver.run import TrainResult


def write_plan(path: Path, plan: WorkerPlan, files: Mapping[str, Sequence[str]]) -> None:
    """Save a worker plan and its split files as JSON for :func:`main`."""
    sections = {name: getattr(plan, name).model_dump(mode="json") for name in _SECTIONS}
    payload = {
        **sections,
        "seed": plan.seed,
        "run_dir": str(plan.run_dir),  # torchrun refuses a run at a URI: a directory is the whole location
        "resolved_config": plan.resolved_config,
        "schedule": asdict(plan.schedule),
        "shuffle_window": plan.shuffle_window,
        "has_validation": plan.has_validation,
        "lineage": plan.lineage,
        "max_seq_length": plan.max_seq_length,
        "packing": plan.packing,
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
        location=RunLocation(Path(raw["run_dir"])),
        resolved_config=raw["resolved_config"],
        schedule=Schedule(**raw["schedule"]),
        shuffle_window=raw["shuffle_window"],
        has_validation=raw["has_validation"],
        lineage=raw["lineage"],
        max_seq_length=raw.get("max_seq_length", 1024),
        packing=raw.get("packing", False),
    )
    return plan, raw["files"]


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of the workers torchrun started (it sets TORCHELASTIC_RUN_ID)."""
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env and "WORLD_SIZE" in env


def train(cfg: RayftConfig, *, resume: bool = False) -> TrainResult | None:
    """One rank of `rayft train CONFIG` under torchrun; rank 0 returns the result, the others None.

    Rank 0 is the run's driver (:func:`rayft.training.driver.run.drive`: lock, claim, data, plan,
    trackers, results) with :class:`TorchrunLauncher` as its launcher; the other ranks wait for
    its plan (:func:`follow`). Rank 0 prepares the data first; then the first process of every
    other node prepares its cached copy (the same units: tokenization is deterministic); then the
    other processes read the cache. A failure in one step is raised on every rank at once.
    """
    import datetime

    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    location = check_torchrun_run(cfg, world)
    timeout = datetime.timedelta(seconds=cfg.failure.collective_timeout_s)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    try:
        if dist.get_rank() != 0:
            follow(cfg)
            return None
        launcher = TorchrunLauncher(cfg)
        try:
            return drive(cfg, launcher, location, start=RunStart(resume=resume), command="rayft train (torchrun)")
        except BaseException as exc:
            launcher.abort(exc)
            raise
    finally:
        dist.destroy_process_group()


class TorchrunLauncher:
    """Rank 0's launcher: hands the plan to the other ranks (:func:`follow`), waits while they
    prepare their copies of the data, then runs its own share of the worker loop and waits for all."""

    uses_ray = False

    def __init__(self, cfg: RayftConfig) -> None:
        self._cfg = cfg
        self._sent = False

    def check(self) -> None:
        """Nothing to check: torchrun started every process."""

    def runtime(self) -> contextlib.AbstractContextManager[Any]:
        """No Ray: torchrun started the processes."""
        return contextlib.nullcontext()

    def launch(self, plan: WorkerPlan, prepared: PreparedData) -> None:
        """Send ``plan``, take part in the others' data preparation, train as rank 0."""
        self._send([plan])
        _prepare_in_turns(self._cfg, rank=0, first_of_node=True, prepared=[prepared])
        _run_rank(self._cfg, plan, prepared)

    def abort(self, exc: BaseException) -> None:
        """Tell the other ranks, still waiting for the plan, why there is none (nothing once it is sent)."""
        if not self._sent:
            self._send([str(exc) if isinstance(exc, RayftError) else f"rank 0: {type(exc).__name__}: {exc}"])

    def _send(self, message: list[Any]) -> None:
        import torch.distributed as dist

        self._sent = True
        dist.broadcast_object_list(message, src=0)


def follow(cfg: RayftConfig) -> None:
    """A rank other than 0: wait for rank 0's plan (or its failure), prepare this rank's copy of
    the data in turn, then train as this rank."""
    import torch.distributed as dist

    message: list[Any] = [None]
    dist.broadcast_object_list(message, src=0)
    if not isinstance(message[0], WorkerPlan):
        raise RayftError(str(message[0]))
    prepared: list[PreparedData] = []
    first_of_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    _prepare_in_turns(cfg, rank=dist.get_rank(), first_of_node=first_of_node, prepared=prepared)
    _run_rank(cfg, message[0], prepared[0])


def _prepare_in_turns(cfg: RayftConfig, *, rank: int, first_of_node: bool, prepared: list[PreparedData]) -> None:
    """The first process of every other node prepares its cached copy, then the remaining ones
    read it (rank 0 prepared in the driver and only takes part in the turns)."""
    _in_turn(rank != 0 and first_of_node, lambda: prepared.append(_prepare(cfg)))
    _in_turn(not prepared, lambda: prepared.append(_prepare(cfg)))


def _run_rank(cfg: RayftConfig, plan: WorkerPlan, prepared: PreparedData) -> None:
    """This rank's share of the worker loop, on the shared run directory; waits for every rank."""
    import torch.distributed as dist

    session = TorchrunSession(split_files(prepared), plan.run_dir, num_to_keep=cfg.checkpoint.num_to_keep)
    with stop_on_sigterm(plan.location, cfg.failure.sigterm_grace_s):
        run_worker(plan, session, REGISTERED)
    dist.barrier()


def check_torchrun_run(cfg: RayftConfig, world: int) -> RunLocation:
    """The run's location, refusing what torchrun cannot do: another world size, a URI storage_path."""
    if world != max(cfg.scaling.num_workers, 1):
        raise ConfigError(
            f"torchrun started {world} processes but scaling.num_workers is {cfg.scaling.num_workers}; set "
            f"scaling.num_workers={world}, or start nnodes x nproc-per-node = {cfg.scaling.num_workers} processes"
        )
    if cfg.task.path is not None:
        raise ConfigError(
            f"task.path={cfg.task.path!r}: a custom task trains on Ray (scaling.num_workers >= 1) or in-process "
            "(scaling.num_workers: 0), not under torchrun; start it with `rayft train CONFIG` instead"
        )
    location = run_location(cfg)
    location.refuse_remote(
        "under torchrun every rank writes the run directory itself; use a path on storage every node mounts "
        "(a ReadWriteMany claim on Kubernetes), or train on Ray for a URI"
    )
    return location


def _prepare(cfg: RayftConfig) -> PreparedData:
    return prepare_training_data(cfg, None, use_ray=False)


def _in_turn(selected: bool, step: Callable[[], object]) -> None:
    """Run ``step`` on the selected ranks while the others wait; a failure is raised on every rank
    (otherwise the others would wait for the collective timeout)."""
    import torch.distributed as dist

    failure = ""
    if selected:
        try:
            step()
        except RayftError as exc:
            failure = str(exc)
        except Exception as exc:
            log.exception("rank %d failed", dist.get_rank())
            failure = f"rank {dist.get_rank()}: {type(exc).__name__}: {exc}"
    messages = [""] * dist.get_world_size()
    dist.all_gather_object(messages, failure)
    errors = [m for m in messages if m]
    if errors:
        raise RayftError(errors[0])


def main(argv: Sequence[str] | None = None) -> None:
    """``torchrun ... -m rayft.training.driver.torchrun PLAN.json``: run one rank of the plan."""
    import torch.distributed as dist

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: torchrun [torchrun options] -m rayft.training.driver.torchrun PLAN.json")
    plan, files = read_plan(Path(args[0]))
    session = TorchrunSession(files, plan.run_dir, num_to_keep=plan.checkpoint.num_to_keep)
    try:
        run_worker(plan, session, REGISTERED)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
