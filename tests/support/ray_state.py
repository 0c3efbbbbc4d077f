"""What lives on the tests' Ray: actors, the processes of Ray actors and Ray Train workers, and
placement groups (to find what an ended driver left, and remove it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any


def actor_classes() -> set[tuple[str, str]]:
    """(actor id, class name) of every actor the local Ray has created so far (from the GCS)."""
    import ray._private.state

    return {(actor_id, info["ActorClassName"]) for actor_id, info in ray._private.state.actors().items()}


def ray_processes(title: str, *, ours: bool = True) -> list[Any]:
    """The processes (psutil) whose command line holds ``title`` (a Ray actor's, ``ray::Class``).

    With ``ours``, only those that descend from this test process (through the Ray it started, or
    a driver it runs): never those of another Ray on the same machine, which may be another test
    process's running beside this one. A cluster from ``ray start`` is not this process's
    descendant: its callers pass ``ours=False`` and tell its processes apart another way."""
    import psutil

    def titled(process: Any) -> bool:
        try:
            return title in " ".join(process.cmdline())
        except psutil.Error:  # ended meanwhile
            return False

    candidates = psutil.Process().children(recursive=True) if ours else psutil.process_iter()
    return [p for p in candidates if titled(p)]


def train_workers(since: float, *, ours: bool = True) -> list[Any]:
    """The Ray Train worker processes (psutil) started at ``since`` (``time.time()``) or later; ``ours``
    as for :func:`ray_processes`."""
    import psutil

    since -= 1.0  # psutil dates a process from the boot time, which Linux gives in whole seconds

    def started(process: Any) -> bool:
        try:
            return bool(process.create_time() >= since)
        except psutil.Error:  # ended meanwhile
            return False

    return [p for p in ray_processes("ray::RayTrainWorker", ours=ours) if started(p)]


def end_orphaned_cleaners() -> list[int]:
    """SIGKILL the placement-group cleaners that a killed driver left on this process's Ray; returns
    their pids.

    For a run on a Ray that rayft did not start (a driver joining the tests' shared Ray by address),
    Ray Train starts a detached ``PlacementGroupCleaner`` that asks the State API every second whether
    the run's controller lives. The shared Ray has no dashboard, hence no State API: once the driver
    is killed its cleaner never gets an answer, and would poll and log a warning every second for the
    rest of the session. The driver's placement group ended with its job, so there is nothing to clean.
    """
    import psutil

    killed = []
    for process in ray_processes("ray::PlacementGroupCleaner"):
        with contextlib.suppress(psutil.Error):
            process.kill()
            killed.append(process.pid)
    return killed


def live_placement_groups() -> dict[str, dict[str, Any]]:
    """The placement groups of this process's Ray that are not removed, by id (hex): their state,
    bundles and the job that made them (an id ends with its job's)."""
    import ray

    return {
        group: {"state": entry["state"], "bundles": list(entry["bundles"].values()), "job": group[-8:]}
        for group, entry in ray.util.placement_group_table().items()
        if entry["state"] != "REMOVED"
    }


def remove_placement_groups(groups: dict[str, Any], grace_s: float) -> dict[str, Any]:
    """Give Ray ``grace_s`` to remove ``groups`` (by id, as :func:`live_placement_groups` gives them),
    then remove those still there; returns those."""
    from rayft.tuning.reaper import remove_group

    left = {group: groups[group] for group in still_live(groups, grace_s)}
    for group in left:
        remove_group(group)
    still_live(left, 10)  # removal is asynchronous: the next test finds the CPUs free
    return left


def still_live(groups: Iterable[str], timeout_s: float) -> set[str]:
    """Those of ``groups`` (ids) that Ray has not removed within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    live = set(groups) & set(live_placement_groups())
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live &= set(live_placement_groups())
    return live
