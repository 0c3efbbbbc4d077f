"""Pure planners of a training run: schedule, learning rate, cadence, retention, resources."""

from __future__ import annotations

import itertools

import pytest

from rayft.runs.selection import CheckpointInfo, choose_resume, plan_retention
from rayft.training.loop.plan import (
    is_due,
    learning_rate_factor,
    micro_batches_in_step,
    missing_resources,
    plan_schedule,
    units_before_step,
)


def test_schedule_splits_units_equally_and_keeps_a_partial_last_step() -> None:
    schedule = plan_schedule(
        num_units=103, world_size=2, micro_batch_size=4, grad_accum=3, num_epochs=2, max_steps=None
    )
    assert schedule.units_per_rank == 51
    assert schedule.dropped_units == 1
    assert schedule.micro_batches_per_epoch == 13  # 12 full micro-batches and one of 3 units
    assert schedule.steps_per_epoch == 5  # 4 steps of 3 micro-batches, one of 1
    assert schedule.total_steps == 10
    assert [micro_batches_in_step(schedule, s, 3) for s in range(5)] == [3, 3, 3, 3, 1]
    assert units_before_step(schedule, 4, 4, 3) == 48
    assert units_before_step(schedule, 5, 4, 3) == 0  # a new epoch starts
    assert schedule.position(7) == (1, 2)


def test_max_steps_overrides_epochs() -> None:
    schedule = plan_schedule(64, 2, 4, 1, num_epochs=1, max_steps=20)
    assert schedule.steps_per_epoch == 8
    assert schedule.total_steps == 20


def test_too_little_data_for_the_workers_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 training units cannot be split over 4 workers"):
        plan_schedule(3, 4, 1, 1, 1, None)


def test_learning_rate_warms_up_linearly_then_decays_to_the_floor() -> None:
    factors = [learning_rate_factor(s, warmup_steps=4, total_steps=20, min_ratio=0.1) for s in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))
    assert learning_rate_factor(20, 4, 20, 0.1) == pytest.approx(0.1)
    assert learning_rate_factor(0, 0, 10, 0.0) == pytest.approx(1.0)


def test_cadence_always_includes_the_last_step() -> None:
    assert [s for s in range(1, 11) if is_due(s, 4, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if is_due(s, None, 10)] == [10]


def test_resume_picks_the_newest_complete_checkpoint() -> None:
    infos = [CheckpointInfo("step-000002", 2, True), CheckpointInfo("step-000004", 4, False)]
    chosen = choose_resume(infos)
    assert chosen is not None and chosen.step == 2
    assert choose_resume([CheckpointInfo("step-000004", 4, False)]) is None


def test_retention_keeps_the_latest_and_the_best() -> None:
    infos = [
        CheckpointInfo("step-000002", 2, True, 3.0),
        CheckpointInfo("step-000004", 4, True, 1.0),
        CheckpointInfo("step-000006", 6, True, 2.0),
        CheckpointInfo("step-000008", 8, True, 5.0),
        CheckpointInfo("step-000010", 10, False),
    ]
    doomed = {c.name for c in plan_retention(infos, num_to_keep=1)}
    assert doomed == {"step-000002", "step-000006", "step-000010"}
    assert {c.name for c in plan_retention(infos, num_to_keep=None)} == {"step-000010"}


def test_retention_without_validation_keeps_the_newest() -> None:
    infos = [CheckpointInfo(f"step-{s:06d}", s, True) for s in (2, 4, 6)]
    assert [c.name for c in plan_retention(infos, num_to_keep=2)] == ["step-000002"]


def test_resources_fit_or_say_what_is_missing() -> None:
    nodes = [{"CPU": 2.0, "memory": 8e9}]
    assert missing_resources({"CPU": 1.0}, 2, nodes) == []
    assert missing_resources({"CPU": 1.0}, 3, nodes) == ["CPU: 3 needed, 2 in the cluster"]
    assert missing_resources({"CPU": 1.0, "GPU": 1.0}, 1, nodes) == ["GPU: 1 needed, 0 in the cluster"]
    split = missing_resources({"CPU": 3.0}, 1, [{"CPU": 2.0}, {"CPU": 2.0}])
    assert split == ["no node can host a worker needing {'CPU': 3.0} (only 0 of 1 fit)"]
