"""The loop's side of profiling: this rank's step timer and trace window, and at each logging
window the ``time/*`` metrics, every rank's breakdown in ``profile/step_times.jsonl`` and a
straggler warning (the planners live in :mod:`rayft.training.profiling`)."""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.train import ProfileConfig
from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.store import open_store
from rayft.training.loop.session import TrainSession, all_gather_objects
from rayft.training.profiling.breakdown import StepTimer, build_step_timer, model_flops_utilization, peak_flops
from rayft.training.profiling.diagnosis import find_straggler
from rayft.training.profiling.trace import TraceWindow, open_trace_window

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rayft.train")


@dataclass
class StepProfile:
    """This rank's step timer, trace window and what the window metrics need."""

    cfg: ProfileConfig
    session: TrainSession
    timer: StepTimer
    trace: TraceWindow | None
    run_dir: Path
    params: int
    peak: float | None

    def step_done(self) -> None:
        """After every optimizer step (and its logging and saving): the trace's step boundary."""
        if self.trace is not None:
            self.trace.step()

    def close(self) -> None:
        """Stop the trace window (writing a window the end of training cut short)."""
        if self.trace is not None:
            self.trace.close()
            self.trace = None

    def window_metrics(self, step: int, tokens_per_s: float | None) -> dict[str, float]:
        """The ``time/*`` means of this window (rank 0's), MFU, and the straggler figures; every
        rank calls this at the same step (it gathers every rank's breakdown). ``tokens_per_s``: all
        ranks' tokens per second (None for a task counting examples: no MFU)."""
        if not self.timer.enabled:
            return {}
        steps = self.timer.steps
        mine: dict[str, Any] = self.timer.take()
        mine.update(memory_figures(self.session.device))
        mine.update(rank=self.session.rank, node=socket.gethostname())
        ranks = all_gather_objects(mine)
        metrics = {k: float(v) for k, v in mine.items() if k.startswith(("time/", "memory/"))}
        per_rank = None if tokens_per_s is None else tokens_per_s / self.session.world_size
        mfu = None if per_rank is None else model_flops_utilization(self.params, per_rank, self.peak)
        if mfu is not None:
            metrics["perf/mfu"] = mfu
        if self.session.world_size > 1:
            metrics.update(self._stragglers(step, ranks))
        if self.session.rank == 0:
            append_window(self.run_dir / layout.STEP_TIMES_FILE, step, steps, ranks)
        return metrics

    def _stragglers(self, step: int, ranks: list[dict[str, Any]]) -> dict[str, float]:
        straggler = find_straggler(ranks, self.cfg.straggler_margin)
        if straggler is None:
            return {"time/straggler_rank": -1.0}
        if self.session.rank == 0:
            log.warning("step %d: %s", step, straggler.describe())
        return {"time/straggler_rank": float(straggler.rank), "time/straggler_slowdown": straggler.slowdown}


def memory_figures(device: torch.device) -> dict[str, float]:
    """Peak GPU memory of the window (GiB and fraction of the device), then reset the peak; none on CPU."""
    if device.type != "cuda":
        return {}
    import torch

    peak = torch.cuda.max_memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.reset_peak_memory_stats(device)
    return {"memory/peak_gib": peak / 2**30, "memory/peak_fraction": peak / total}


def append_window(path: Path, step: int, steps: int, ranks: list[dict[str, Any]]) -> None:
    """Append one logging window's breakdown of every rank to ``profile/step_times.jsonl``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, "steps": steps, "ranks": ranks}) + "\n")


def open_step_profile(
    cfg: ProfileConfig, session: TrainSession, location: RunLocation, *, params: int, start_step: int
) -> StepProfile:
    """This rank's profile of the run at ``location``: the timer of ``cfg.step_timing`` and, when set,
    the trace window (its files uploaded to a remote run as they are written). A restart drops the
    windows past ``start_step``."""
    device = session.device
    run_dir = location.local_dir
    if session.rank == 0:
        truncate_windows(run_dir / layout.STEP_TIMES_FILE, start_step)

    store = open_store(location)

    def upload(path: Path) -> None:
        store.persist(path.relative_to(run_dir).as_posix())  # a no-op for a run in a directory

    trace = open_trace_window(cfg, run_dir, session.rank, device.type, upload)
    peak = None
    if device.type == "cuda":
        import torch

        peak = peak_flops(torch.cuda.get_device_name(device))
    return StepProfile(cfg, session, build_step_timer(cfg.step_timing, device.type), trace, run_dir, params, peak)


def truncate_windows(path: Path, start_step: int) -> None:
    """Keep only the windows up to ``start_step`` (a resumed run recomputes the later ones)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= start_step]
    path.write_text("".join(f"{line}\n" for line in keep))
