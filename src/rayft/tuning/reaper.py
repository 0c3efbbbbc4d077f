"""Removing the placement groups of stopped trials' workers.

Tune stops a trial (an early stop, a PBT pause) by ending the trial's process, and with it the
Ray Train controller it started; the workers' placement group outlives them, holding the
resources that the next trial needs. Each trial records its groups in its run directory
(:func:`rayft._ray_private.placement_group_recorder`); they are removed when the trial starts
again and, by :class:`reaper_callback`, once Tune no longer runs the trial.

A group is recorded only once its workers have started, seconds after Ray Train reserved it, and
the launcher's probe of the cluster reserves one of its own for a moment: a trial stopped in
between leaves a group that no record names. Its creator (the controller, the trial's process)
is then dead, which is how the reaper finds it (:func:`rayft._ray_private.remove_orphaned_groups`);
after the sweep, :func:`settle_groups` waits for its trials' processes to be marked dead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rayft._ray_private import GROUPS_DIR, actor_made_groups, remove_group, remove_orphaned_groups
from rayft._ray_private import remove_recorded_groups as _remove_recorded

log = logging.getLogger("rayft.tune")

__all__ = ["GROUPS_DIR", "reaper_callback", "remove_group", "remove_recorded_groups"]


def remove_recorded_groups(run_dir: Path) -> int:
    """Remove every placement group recorded in the trial run directory ``run_dir``; returns how
    many records were cleared."""
    return _remove_recorded(run_dir / GROUPS_DIR)


def reaper_callback(run_dir_of: Any, interval_s: float = 1.0) -> Any:
    """A Tune callback of the sweep's driver that removes the recorded placement groups of every
    trial Tune is not running (``run_dir_of(trial_id)``: its run directory), at most every
    ``interval_s`` and when the sweep ends."""
    from ray.tune import Callback

    class PlacementGroupReaper(Callback):
        def __init__(self) -> None:
            self._last = 0.0

        def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
            now = time.monotonic()
            if now - self._last < interval_s:
                return
            self._last = now
            reap([t for t in trials if t.status != "RUNNING"])

        def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
            reap(trials)

    def reap(trials: list[Any]) -> None:
        for trial in trials:
            remove_recorded_groups(run_dir_of(trial.trial_id))
        for group in remove_orphaned_groups():
            log.debug("removed placement group %s of a stopped trial", group)

    return PlacementGroupReaper()


SETTLE_TIMEOUT_S = 30.0
"""How long, after a sweep, its trials' ended processes have to be marked dead by Ray."""


def settle_groups(before: set[str], timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
    """After a sweep: wait until every placement group an actor made during it (those not in
    ``before``, from :func:`rayft._ray_private.actor_made_groups`) is gone, removing each whose maker
    has died; returns the ids of those still held at ``timeout_s`` (warned of).

    Tune ends the processes of the trials it stops after the sweep's last result, and Ray marks
    them dead a moment later: only then can their unrecorded groups be told from a live actor's."""
    deadline = time.monotonic() + timeout_s
    while True:
        for group in remove_orphaned_groups():
            log.debug("removed placement group %s of an ended trial", group)
        held = [group for group in actor_made_groups() if group not in before]
        if not held or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if held:
        log.warning("tune: placement groups %s of the sweep's trials are still reserved %g s after it", held, timeout_s)
    return held
