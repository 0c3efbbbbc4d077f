"""How many trials of a sweep run side by side: a pure decision from the config and the cluster.

A trial is a Ray Tune function trial that builds and fits a ``TorchTrainer``: the trial's own
process reserves :data:`TRIAL_DRIVER_RESOURCES` (what ``tune.with_resources`` gives it; Train V2's
controller actor asks for no CPU), and the trainer's workers reserve ``scaling`` on top of that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rayft.config.schema import RayftConfig
from rayft.errors import ConfigError, ResourceError
from rayft.training.driver.launcher import resolve_use_gpu, worker_resources
from rayft.tuning.space import count_trials

TRIAL_DRIVER_RESOURCES: Mapping[str, float] = {"memory": 1.0}
"""What each trial's own process reserves besides its training workers: a token byte of memory, so
that Tune can place it without holding a CPU that the trial's training workers need (they reserve
``scaling`` themselves)."""


@dataclasses.dataclass(frozen=True)
class ConcurrencyPlan:
    """How many trials run at once, what each one reserves, and why (a line for the console)."""

    concurrent: int
    per_trial: dict[str, float]
    reason: str


def plan_concurrency(
    cfg: RayftConfig,
    cluster_resources: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]] | None = None,
    driver: Mapping[str, float] = TRIAL_DRIVER_RESOURCES,
) -> ConcurrencyPlan:
    """Run as many trials at once as the cluster holds, at most ``max_concurrent_trials`` and the
    number of trials.

    Args:
        cfg: The config with its ``tune`` section.
        cluster_resources: The cluster's total resources (``ray.cluster_resources()``).
        nodes: Each alive node's total resources; with them trials are placed node by node (a
            worker cannot straddle two nodes), without them the totals are divided.
        driver: What a trial's own process reserves.

    Raises:
        ResourceError: not even one trial fits, with what a trial needs, what the cluster has and the fix.
    """
    if cfg.tune is None:
        raise ConfigError("the config has no tune: section; add one with a search_space to run a sweep")
    use_gpu = resolve_use_gpu(cfg.scaling.use_gpu, dict(cluster_resources))
    per_worker = worker_resources(cfg.scaling, use_gpu)
    per_trial = _trial_total(per_worker, cfg.scaling.num_workers, driver)
    fit = (
        _fit_on_nodes(per_worker, cfg.scaling.num_workers, driver, nodes)
        if nodes
        else _fit_in(per_trial, cluster_resources)
    )
    if fit == 0:
        raise ResourceError(
            f"a trial needs {_text(per_trial)} ({cfg.scaling.num_workers} worker(s) x {_text(per_worker)} plus "
            f"{_text(driver)} for the trial itself), the cluster has {_text(cluster_resources)}: lower "
            "scaling.num_workers or scaling.resources_per_worker, or add nodes"
        )
    trials = count_trials(cfg.tune)
    limits = {"fit in the cluster": fit, "trials in the sweep": trials}
    if cfg.tune.max_concurrent_trials is not None:
        limits["tune.max_concurrent_trials"] = cfg.tune.max_concurrent_trials
    concurrent = min(limits.values())
    bound = next(name for name, value in limits.items() if value == concurrent)
    reason = (
        f"{concurrent} of {trials} trial(s) at once ({bound}): each trial reserves {_text(per_trial)} "
        f"({cfg.scaling.num_workers} worker(s) x {_text(per_worker)} + {_text(driver)} for the trial), "
        f"the cluster has {_text(cluster_resources)}, room for {fit}"
    )
    return ConcurrencyPlan(concurrent=concurrent, per_trial=per_trial, reason=reason)


def _trial_total(per_worker: Mapping[str, float], workers: int, driver: Mapping[str, float]) -> dict[str, float]:
    total = {key: value * workers for key, value in per_worker.items()}
    for key, value in driver.items():
        total[key] = total.get(key, 0.0) + value
    return {key: value for key, value in total.items() if value > 0}


def _fit_in(per_trial: Mapping[str, float], available: Mapping[str, float]) -> int:
    """How many whole trials the totals hold (Ray's resource amounts are exact to 1e-4)."""
    return min((int(available.get(key, 0.0) / need + 1e-6) for key, need in per_trial.items()), default=10_000)


def _fit_on_nodes(
    per_worker: Mapping[str, float],
    workers: int,
    driver: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]],
) -> int:
    """Place trial after trial (its driver, then its workers, each on the fullest node that holds it)."""
    free = [dict(node) for node in nodes]
    bundles = [dict(driver)] * (1 if any(v > 0 for v in driver.values()) else 0) + [dict(per_worker)] * workers
    placed = 0
    while all(_take(free, bundle) for bundle in bundles):
        placed += 1
        if placed > 10_000:  # a trial that reserves nothing fits without end
            break
    return placed


def _take(free: list[dict[str, float]], bundle: Mapping[str, float]) -> bool:
    fits = [node for node in free if all(node.get(k, 0.0) + 1e-6 >= v for k, v in bundle.items())]
    if not fits:
        return False
    node = min(fits, key=lambda n: sum(n.values()))
    for key, value in bundle.items():
        node[key] = node.get(key, 0.0) - value
    return True


def _text(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU", "memory") or not k.startswith("node:")}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items()) if not k.startswith("object_store")) + "}"
