"""Pure planners over step breakdowns: which rank holds the others back, and what bounds the run.

A rank's breakdown is a mapping of ``time/*`` means (seconds per step, see
:mod:`rayft.training.profiling.breakdown`) with its ``rank`` and ``node``. Nothing here reads
files or clocks, so the rules are unit-tested on figures alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Share of the step above which a phase bounds the run (tuned so a healthy run shows none).
DATA_BOUND_SHARE = 0.25
COMM_BOUND_SHARE = 0.30
CHECKPOINT_BOUND_SHARE = 0.15
MEMORY_BOUND_FRACTION = 0.90

FIXES = {
    "data-bound": (
        "the loop waits for its batches: set data.packing true (fewer, fuller batches), keep the prepared data "
        "on a local disk, and lighten a custom task's collate"
    ),
    "communication-bound": (
        "collectives take the step: raise train.micro_batch_size or train.gradient_accumulation_steps (fewer "
        "synchronisations per token), or use train.strategy ddp when the model fits one worker"
    ),
    "memory-bound": (
        "the GPU is nearly full: set train.gradient_checkpointing true and train.fused_loss chunked, or lower "
        "train.micro_batch_size and raise train.gradient_accumulation_steps"
    ),
    "checkpoint-bound": "saving takes the step: set checkpoint.async_upload true and raise train.save_steps",
    "straggler": (
        "one rank is slower than the others, who wait for it: check its node for other jobs, thermal "
        "throttling or a slower disk, or leave the node out"
    ),
    "compute-bound": (
        "forward and backward take the step, as they should: mixed precision, train.compile or a larger "
        "micro-batch make them faster"
    ),
}


@dataclass(frozen=True)
class Straggler:
    """A rank whose busy time per step exceeds the ranks' median by more than the margin."""

    rank: int
    node: str
    busy_s: float
    median_s: float

    @property
    def slowdown(self) -> float:
        """How many times the median's busy time this rank takes."""
        return self.busy_s / max(self.median_s, 1e-12)

    def describe(self) -> str:
        """One line naming the rank, its node and the figures."""
        return (
            f"rank {self.rank} on node {self.node} is a straggler: {self.busy_s:.3f} s busy per step against a "
            f"median of {self.median_s:.3f} s ({self.slowdown:.1f}x)"
        )


@dataclass(frozen=True)
class Finding:
    """One bottleneck: its name, how large it is, and what to change."""

    verdict: str
    share: float
    detail: str

    @property
    def fix(self) -> str:
        """What to change about it."""
        return FIXES[self.verdict]


def busy_seconds(breakdown: Mapping[str, Any]) -> float:
    """Seconds per step a rank works: its step time less the time it waits in collectives (where
    a fast rank waits for a slow one)."""
    return float(breakdown.get("time/step", 0.0)) - float(breakdown.get("time/comm", 0.0))


def find_straggler(ranks: Sequence[Mapping[str, Any]], margin: float) -> Straggler | None:
    """The slowest rank, when its busy time is more than ``(1 + margin)`` times the median's.

    The median is the lower median, so that with two ranks the slower one is compared with the
    faster one rather than with their mean. Fewer than two ranks: no straggler.
    """
    timed = [r for r in ranks if "time/step" in r]
    if len(timed) < 2:
        return None
    median = statistics.median_low(busy_seconds(r) for r in timed)
    slowest = max(timed, key=busy_seconds)
    if busy_seconds(slowest) <= median * (1.0 + margin):
        return None
    return Straggler(int(slowest["rank"]), str(slowest.get("node", "?")), busy_seconds(slowest), median)


def diagnose(ranks: Sequence[Mapping[str, Any]], margin: float) -> list[Finding]:
    """The run's bottlenecks, largest first; ``compute-bound`` alone when none stands out.

    Shares are taken on the (lower) median rank by busy time, so one straggler does not make the
    whole run look data-bound; the straggler is a finding of its own.
    """
    timed = sorted((r for r in ranks if r.get("time/step")), key=busy_seconds)
    if not timed:
        return []
    findings: list[Finding] = []
    straggler = find_straggler(timed, margin)
    if straggler is not None:
        findings.append(Finding("straggler", straggler.slowdown - 1.0, straggler.describe()))
    typical = dict(timed[(len(timed) - 1) // 2])
    step = float(typical["time/step"])
    if straggler is not None:  # the others' wait for the straggler is its finding, not communication
        typical["time/comm"] = max(0.0, float(typical.get("time/comm", 0.0)) - (straggler.busy_s - straggler.median_s))
    findings.extend(_phase_findings(typical, step))
    memory = typical.get("memory/peak_fraction")
    if memory is not None and float(memory) >= MEMORY_BOUND_FRACTION:
        findings.append(Finding("memory-bound", float(memory), f"peak GPU memory {float(memory):.0%} of the device"))
    findings.sort(key=lambda f: f.share, reverse=True)
    if not findings:
        share = (float(typical.get("time/forward", 0.0)) + float(typical.get("time/backward", 0.0))) / step
        findings.append(Finding("compute-bound", share, f"forward and backward {share:.0%} of the step"))
    return findings


def _phase_findings(breakdown: Mapping[str, Any], step: float) -> list[Finding]:
    """The phases of ``breakdown`` whose share of ``step`` passes its bound."""
    rules = (
        ("data-bound", "time/data_wait", DATA_BOUND_SHARE, "waiting for data"),
        ("communication-bound", "time/comm", COMM_BOUND_SHARE, "in collectives"),
        ("checkpoint-bound", "time/checkpoint", CHECKPOINT_BOUND_SHARE, "saving checkpoints"),
    )
    found = []
    for verdict, key, bound, what in rules:
        share = float(breakdown.get(key, 0.0)) / step
        if share > bound:
            found.append(Finding(verdict, share, f"{share:.0%} of the step {what}"))
    return found


def merge_windows(windows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-rank breakdowns over a whole run from its logging windows (each ``{"step", "steps",
    "ranks": [...]}``, as ``profile/step_times.jsonl`` holds them), weighted by the steps of each."""
    sums: dict[int, dict[str, Any]] = {}
    for window in windows:
        steps = int(window.get("steps", 1))
        for row in window.get("ranks", []):
            merged = sums.setdefault(int(row["rank"]), {"rank": int(row["rank"]), "node": row.get("node", "?")})
            merged["steps"] = merged.get("steps", 0) + steps
            for key, value in row.items():
                if key.startswith("time/") and isinstance(value, int | float):
                    merged[key] = merged.get(key, 0.0) + float(value) * steps
                elif key.startswith("memory/") and isinstance(value, int | float):
                    merged[key] = max(merged.get(key, 0.0), float(value))  # the peak of the run
    return [
        {k: (v / row["steps"] if k.startswith("time/") else v) for k, v in row.items()}
        for _, row in sorted(sums.items())
    ]
