"""The on-demand trace: ``torch.profiler`` over a window of steps (``train.profile``), one
Chrome/Perfetto JSON per rank in the run directory, and a CUDA memory snapshot when asked.

Before its window no profiler exists (it is created when the wait ends); after it the profiler
records nothing; without a window (``active_steps`` 0) no profiler is created at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rayft.config.train import ProfileConfig
from rayft.runs import layout

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rayft.train")


class TraceWindow:
    """A running ``torch.profiler.profile`` whose schedule is the config's window.

    Call :meth:`step` after every optimizer step and :meth:`close` at the end; the trace is
    written when the window closes (``on_written`` then gets its path, e.g. to upload it).
    """

    def __init__(
        self, cfg: ProfileConfig, run_dir: Path, rank: int, device_type: str, on_written: Callable[[Path], None]
    ) -> None:
        import torch

        self._cfg, self._rank, self._on_written = cfg, rank, on_written
        self._trace = run_dir / layout.trace_file(rank)
        self._memory = (
            run_dir / layout.memory_snapshot_file(rank) if cfg.memory_snapshot and device_type == "cuda" else None
        )
        self._steps = 0
        kinds = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        self._activities = [kinds[a] for a in cfg.activities if a == "cpu" or device_type == "cuda"]
        self._profiler: torch.profiler.profile | None = None
        if cfg.wait_steps == 0:
            self._start()

    def _start(self) -> None:
        """Create and start the profiler at the end of the wait: before it, nothing of torch.profiler
        runs at all (not even its per-step bookkeeping), so a window far ahead costs nothing."""
        import torch

        cfg = self._cfg
        schedule = torch.profiler.schedule(
            wait=cfg.wait_steps, warmup=cfg.warmup_steps, active=cfg.active_steps, repeat=1
        )
        self._profiler = torch.profiler.profile(
            activities=self._activities, schedule=schedule, on_trace_ready=self._write, record_shapes=False
        )
        self._profiler.step_num = self._steps  # its steps, and the trace's ProfilerStep#N, count from the run's
        self._profiler.start()

    def step(self) -> None:
        """Mark the end of an optimizer step (the profiler's step boundary)."""
        self._steps += 1
        if self._memory is not None and self._steps == self._cfg.wait_steps + self._cfg.warmup_steps:
            import torch

            torch.cuda.memory._record_memory_history(max_entries=100_000)
        if self._profiler is not None:
            self._profiler.step()
        elif self._steps == self._cfg.wait_steps:
            self._start()

    def close(self) -> None:
        """Stop the profiler (a window cut short by the end of training is written here)."""
        if self._profiler is not None:
            self._profiler.stop()

    def _write(self, profiler: torch.profiler.profile) -> None:
        self._trace.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self._trace))
        log.info("rank %d: profiler trace of %d steps written to %s", self._rank, self._cfg.active_steps, self._trace)
        self._on_written(self._trace)
        if self._memory is not None:
            import torch

            torch.cuda.memory._dump_snapshot(str(self._memory))  # type: ignore[no-untyped-call] # torch leaves it untyped
            torch.cuda.memory._record_memory_history(enabled=None)
            self._on_written(self._memory)


def open_trace_window(
    cfg: ProfileConfig, run_dir: Path, rank: int, device_type: str, on_written: Callable[[Path], None]
) -> TraceWindow | None:
    """This rank's trace window, or None when the config sets none or leaves this rank out."""
    if not cfg.traces or (cfg.ranks is not None and rank not in cfg.ranks):
        return None
    return TraceWindow(cfg, run_dir, rank, device_type, on_written)
