"""A loop callback that records which C allocator its worker's process runs with."""

from __future__ import annotations

from pathlib import Path

from rayft.training.loop.callbacks import LoopCallback, StepInfo
from rayft.training.loop.heap import process_allocator

RECORDER = "tests.support.allocator:RecordAllocator"


class RecordAllocator(LoopCallback):
    """Writes the worker's allocator (by its memory map) to ``out/rank-N`` when training starts."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_start(self, info: StepInfo) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank-{info.rank}").write_text(process_allocator())
