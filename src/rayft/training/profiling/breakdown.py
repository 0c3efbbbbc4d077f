"""The always-on step breakdown: per-phase seconds of one rank's optimizer steps, and MFU.

A step runs from the end of the previous step to the end of this one, so the time a rank spends
saving or evaluating after a step counts in the next one (as ``checkpoint`` and ``eval``). Phases
are laps of one clock: each :meth:`StepTimer.lap` gives the seconds since the previous lap to a
phase, so the phases of a step add up to its wall time but for what :meth:`StepTimer.skip` leaves
out (writing the metrics themselves).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

PHASES = ("data_wait", "rollout", "forward", "backward", "optimizer", "comm", "checkpoint", "eval")
"""The ``time/<phase>`` components of a step, in the order a step runs them."""

# Dense bf16/fp16 tensor peaks (FLOP/s) of the devices whose peak is published; the first name
# contained in the device's name wins, so the more specific names come first.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense half-precision peak of a device named ``device_name`` (None when unknown)."""
    return next((flops for name, flops in PEAK_FLOPS if name in device_name), None)


def model_flops_utilization(params: int, tokens_per_s: float, peak: float | None) -> float | None:
    """The fraction of ``peak`` FLOP/s that training at ``tokens_per_s`` uses, counting 6 FLOPs
    per parameter per token (forward 2, backward 4: the usual convention, also for LoRA)."""
    if peak is None or peak <= 0:
        return None
    return 6.0 * params * tokens_per_s / peak


@dataclass
class StepTimer:
    """Per-phase seconds of this rank's steps since the last :meth:`take`.

    ``sync`` runs before every clock reading (``torch.cuda.synchronize`` for exact GPU phases);
    a disabled timer does nothing at all.
    """

    enabled: bool = True
    sync: Callable[[], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    parts: dict[str, float] = field(default_factory=dict)
    """Seconds of parts within a phase (GRPO's ``rollout_sample`` and ``rollout_tools``), reported beside the phases."""
    step_seconds: float = 0.0
    steps: int = 0
    _last: float = 0.0
    _step_start: float = 0.0

    def start(self) -> None:
        """Start the clock at the beginning of the first step."""
        self._last = self._step_start = self.clock()

    def lap(self, phase: str) -> None:
        """Give the seconds since the previous lap to ``phase``."""
        if not self.enabled:
            return
        if self.sync is not None:
            self.sync()
        now = self.clock()
        self.totals[phase] += now - self._last
        self._last = now

    def part(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to the part ``name`` of a phase (already counted in the phase: not a lap)."""
        if self.enabled:
            self.parts[name] = self.parts.get(name, 0.0) + seconds

    def skip(self) -> None:
        """Leave the seconds since the previous lap out of every phase (they still count in the step)."""
        if self.enabled:
            self._last = self.clock()

    def end_step(self) -> None:
        """Close a step: its wall time counts in ``time/step``."""
        if not self.enabled:
            return
        now = self._last  # the step's last lap
        self.step_seconds += now - self._step_start
        self._step_start = now
        self.steps += 1

    def take(self) -> dict[str, float]:
        """Mean seconds per step of each phase and of the whole step over the window (``time/*``),
        then start a new window; empty when disabled or no step ended."""
        if not self.enabled or self.steps == 0:
            return {}
        means = {f"time/{phase}": total / self.steps for phase, total in self.totals.items()}
        means["time/step"] = self.step_seconds / self.steps
        means.update({f"time/{name}": total / self.steps for name, total in self.parts.items()})
        self.totals, self.parts = dict.fromkeys(PHASES, 0.0), {}
        self.step_seconds, self.steps = 0.0, 0
        return means


def build_step_timer(mode: str, device_type: str) -> StepTimer:
    """The timer of a ``train.profile.step_timing`` mode on a device of ``device_type``."""
    if mode == "none":
        return StepTimer(enabled=False)
    if mode == "synced" and device_type == "cuda":
        import torch

        return StepTimer(sync=torch.cuda.synchronize)
    return StepTimer()
