"""Where rank 0 sends per-step metrics: metrics.jsonl, TensorBoard, and a console progress line.

Per-step metrics never go through ``ray.train.report`` (about 1.8 s per call); Ray only sees
them with checkpoints.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rayft.console import clock

log = logging.getLogger("rayft.train")


class MetricLogger(Protocol):
    """A sink for metrics keyed by optimizer step."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at ``step``."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...


class JsonlLogger:
    """Appends one JSON object per call to metrics.jsonl; on resume, drops records past the restart."""

    def __init__(self, path: Path, resume_step: int = 0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step >= 0 and path.exists():
            keep = [line for line in path.read_text().splitlines() if _step_of(line) <= resume_step]
            path.write_text("".join(f"{line}\n" for line in keep))
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the run

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one line and flush it, so a crash loses at most the line being written."""
        record = {"step": step, "time": round(time.time(), 6), **{k: _finite(v) for k, v in metrics.items()}}
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        self._handle.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 0


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class TensorBoardLogger:
    """Writes scalars to TensorBoard event files."""

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(directory))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add each metric as a scalar at ``step``."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Flush the event file."""
        self._writer.close()


class ConsoleLogger:
    """A progress line per logged step: step/total, loss, learning rate, tokens/s, ETA."""

    def __init__(self, total_steps: int, start_step: int) -> None:
        self._total = total_steps
        self._start_step = start_step
        self._start = time.monotonic()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Print the line (evaluation results get their own line)."""
        if "eval/loss" in metrics:
            figures = "  ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name.startswith("eval/"))
            log.info("step %d/%d  %s", step, self._total, figures)
            return
        if "train/loss" not in metrics:
            return
        done = step - self._start_step
        elapsed = time.monotonic() - self._start
        eta = elapsed / done * (self._total - step) if done > 0 else math.nan
        rate, unit = next(
            ((value, name[len("train/") : -len("_per_s")]) for name, value in metrics.items()
             if name.startswith("train/") and name.endswith("_per_s")), (math.nan, "tokens"),
        )  # fmt: skip
        # GRPO's loss hovers near 0 by construction: its reward is what shows progress.
        rl = f"  reward {metrics['rl/reward']:.3f}  pass@1 {metrics['rl/pass@1']:.3f}" if "rl/reward" in metrics else ""
        if "rl/episode/turns" in metrics:  # multi-turn episodes: mean turns and tool calls per episode
            rl += f"  turns {metrics['rl/episode/turns']:.2f}  tools {metrics['rl/episode/tool_calls']:.2f}"
        if "rl/groups_drawn" in metrics:  # dynamic sampling: groups kept of those drawn, extra rollouts, short steps
            kept = metrics["rl/groups_drawn"] - metrics["rl/groups_dropped"]
            rl += (f"  groups {kept:.0f}/{metrics['rl/groups_drawn']:.0f} (+{metrics['rl/extra_rollouts']:.0f} "
                   f"rollouts, {metrics['rl/short_steps']:.0f} short)")  # fmt: skip
        log.info(
            "step %d/%d  loss %.4f%s  lr %.2e  grad_norm %.3f  %.0f %s/s  eta %s",
            step, self._total, metrics["train/loss"], rl, metrics.get("train/learning_rate", math.nan),
            metrics.get("train/grad_norm", math.nan), rate, "tok" if unit == "tokens" else unit, clock(eta),
        )  # fmt: skip

    def close(self) -> None:
        """Nothing to release."""


@dataclass
class ThroughputWindow:
    """Tokens and training seconds since the last log line, for ``train/tokens_per_s``.

    Only the time from the end of one step's bookkeeping to the end of the next step counts:
    time spent logging, evaluating and saving is left out, and the tokens and seconds of every
    step in a ``logging_steps`` window are summed alike.
    """

    clock: Callable[[], float] = time.monotonic
    tokens: float = 0.0
    computed: float = 0.0
    seconds: float = 0.0
    started: float = field(default=math.nan)

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def add_step(self, real_tokens: int, computed_tokens: int) -> None:
        """Count a step that has just finished: its tokens and the seconds since :meth:`restart`."""
        self.tokens += real_tokens
        self.computed += computed_tokens
        self.seconds += self.clock() - self.started

    def restart(self) -> None:
        """Start timing the next step (after this step's logging, evaluation and saving)."""
        self.started = self.clock()

    def take_tokens_per_s(self) -> float:
        """Real tokens per training second over the window, then start a new window."""
        rate = self.tokens / max(self.seconds, 1e-9)
        self.tokens = self.computed = self.seconds = 0.0
        return rate


class MultiLogger:
    """Fans metrics out to several loggers."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self._loggers = list(loggers)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Send to every logger."""
        for logger in self._loggers:
            logger.log(step, metrics)

    def close(self) -> None:
        """Close every logger."""
        for logger in self._loggers:
            logger.close()


class NullLogger:
    """Discards everything (workers other than rank 0)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Discard."""

    def close(self) -> None:
        """Nothing to release."""
