"""train/tokens_per_s: tokens and training seconds summed over the whole logging window."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rayft.training.loop.checkpointing import TrainerState
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.metrics import ThroughputWindow
from rayft.training.loop.steps import StepStats
from rayft.training.loop.worker import after_step
from rayft.training.profiling.breakdown import StepTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowLogger:
    """Records metrics; each call takes ``cost_s`` of (fake) time, as logging and evaluation do."""

    def __init__(self, clock: FakeClock, cost_s: float) -> None:
        self.clock, self.cost_s = clock, cost_s
        self.records: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.records.append(metrics)
        self.clock.now += self.cost_s


@pytest.mark.parametrize("logging_steps", [1, 10])
def test_tokens_per_s_is_the_training_rate_for_any_logging_window(logging_steps: int) -> None:
    # Every step trains 155 tokens in 1 s; each log line then costs 2 s that is not training.
    clock = FakeClock()
    logger = SlowLogger(clock, cost_s=2.0)
    plan = SimpleNamespace(
        schedule=SimpleNamespace(total_steps=1000, steps_per_epoch=1000),
        train=SimpleNamespace(logging_steps=logging_steps, save_steps=10_000, eval_steps=None),
        has_validation=False,
    )
    worker = SimpleNamespace(
        plan=plan,
        state=TrainerState(),
        logger=logger,
        scheduler=SimpleNamespace(get_last_lr=lambda: [1e-4]),
        window=ThroughputWindow(clock=clock),
        window_units=0.0,
        method=SimpleNamespace(throughput_unit="tokens", figures=MethodHooks().figures),  # a method without figures
        session=SimpleNamespace(device=None, world_size=1),
        profile=SimpleNamespace(timer=StepTimer(enabled=False), window_metrics=lambda step, rate: {}),
    )
    for _ in range(30):
        clock.now += 1.0
        worker.state.step += 1
        stats = StepStats(loss=1.0, label_tokens=155, real_tokens=155, computed_tokens=160, grad_norm=1.0)
        after_step(worker, stats)
    rates = [record["train/tokens_per_s"] for record in logger.records]
    assert len(rates) == 30 // logging_steps
    assert rates == pytest.approx([155.0] * len(rates))
