"""How many trials of a sweep run at once, from the scaling of one trial and the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from rayft.config import RayftConfig
from rayft.errors import ResourceError
from rayft.tuning.plan import plan_concurrency
from rayft.tuning.sweep import trial_driver_resources

SPACE = {"train.learning_rate": {"loguniform": [1e-5, 1e-3]}}
MEMORY = 64e9  # every Ray node reports its memory; a trial's own process reserves a byte of it


def config(workers: int = 1, per_worker: dict[str, float] | None = None, **tune: Any) -> RayftConfig:
    return RayftConfig(
        scaling={"num_workers": workers, "use_gpu": "auto", "resources_per_worker": per_worker or {}},
        tune={"search_space": SPACE, **tune},
    )


def test_cluster_bound_counts_the_trial_driver() -> None:
    plan = plan_concurrency(config(workers=2, num_samples=8), {"CPU": 8.0, "memory": MEMORY})
    assert plan.concurrent == 4 and plan.per_trial == {"CPU": 2.0, "memory": 1.0}
    assert plan.reason.startswith("4 of 8 trial(s) at once (fit in the cluster)")
    assert "2 worker(s) x {CPU: 1} + {memory: 1} for the trial" in plan.reason


def test_the_plan_reserves_for_a_trial_what_tune_is_given() -> None:
    cfg = config(workers=2, num_samples=8)
    plan = plan_concurrency(cfg, {"CPU": 2.0, "memory": MEMORY})
    # The trial's own process holds no CPU: two workers of one CPU each fill a two-CPU cluster.
    assert plan.concurrent == 1 and plan.per_trial == {"CPU": 2.0, **trial_driver_resources(cfg)}


def test_capped_by_max_concurrent_and_by_the_number_of_trials() -> None:
    capped = plan_concurrency(config(num_samples=8, max_concurrent_trials=3), {"CPU": 16.0, "memory": MEMORY})
    assert (capped.concurrent, capped.reason.split(":")[0]) == (
        3,
        "3 of 8 trial(s) at once (tune.max_concurrent_trials)",
    )
    few = plan_concurrency(config(num_samples=2, max_concurrent_trials=3), {"CPU": 16.0, "memory": MEMORY})
    assert few.concurrent == 2 and "(trials in the sweep)" in few.reason


def test_gpus_auto_follow_the_cluster() -> None:
    plan = plan_concurrency(config(workers=2, num_samples=8), {"CPU": 64.0, "GPU": 4.0, "memory": MEMORY})
    assert plan.per_trial == {"CPU": 2.0, "GPU": 2.0, "memory": 1.0} and plan.concurrent == 2


def test_nodes_keep_a_worker_on_one_node() -> None:
    cfg = config(workers=2, per_worker={"CPU": 3.0}, num_samples=8)
    # A trial reserves 2 x 3 CPUs. Three nodes of 4 CPUs hold one; six nodes of 2 CPUs hold the same
    # 12 CPUs in total but no worker of 3, so no trial at all.
    nodes = [{"CPU": 4.0, "memory": MEMORY}] * 3
    assert plan_concurrency(cfg, {"CPU": 12.0, "memory": 3 * MEMORY}, nodes=nodes).concurrent == 1
    nodes = [{"CPU": 2.0, "memory": MEMORY}] * 6
    with pytest.raises(ResourceError, match=r"a trial needs \{CPU: 6, memory: 1\}"):
        plan_concurrency(cfg, {"CPU": 12.0, "memory": 6 * MEMORY}, nodes=nodes)


def test_nothing_fits_fails_with_need_have_and_fix() -> None:
    with pytest.raises(
        ResourceError,
        match=r"a trial needs \{CPU: 4, memory: 1\} \(4 worker\(s\) x \{CPU: 1\} plus \{memory: 1\} for the trial "
        r"itself\), the cluster has \{CPU: 2, memory: 6.4e\+10\}: lower scaling.num_workers",
    ):
        plan_concurrency(config(workers=4), {"CPU": 2.0, "memory": MEMORY})


def test_grid_points_count_as_trials() -> None:
    cfg = RayftConfig(tune={"search_algorithm": "grid", "search_space": {"lora.r": {"grid": [4, 8, 16]}}})
    plan = plan_concurrency(cfg, {"CPU": 64.0, "memory": MEMORY})
    assert plan.concurrent == 3 and plan.reason.startswith("3 of 3 trial(s)")
