"""Removing the placement groups of stopped trials' workers.

Tune stops a trial (an early stop, a PBT pause) by ending the trial's process, and with it the
Ray Train controller it started; the workers' placement group outlives them, holding the
resources that the next trial needs. Each trial records its groups in its run directory
(:func:`rayft._ray_private.placement_group_recorder`); they are removed when the trial starts
again and, by :class:`reaper_callback`, once Tune no longer runs the trial. A group that a trial's
process made and had no time to record or free (the launcher's reservation probe, or a controller's
group before its record is written, when Tune ends the process mid-way) is removed once its maker is
dead: by the callback while the sweep runs, and by :func:`settle_groups` after it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from rayft._ray_private import actor_made_groups, remove_orphaned_groups

log = logging.getLogger("rayft.tune")

GROUPS_DIR = ".placement-groups"
"""In a trial's run directory: one empty file per placement group its runs reserved, named by id."""


def remove_recorded_groups(run_dir: Path) -> int:
    """Remove every placement group recorded under ``run_dir`` (those already gone are skipped);
    returns how many records were cleared."""
    directory = run_dir / GROUPS_DIR
    if not directory.is_dir():
        return 0
    cleared = 0
    for record in directory.iterdir():
        with contextlib.suppress(Exception):  # removed already, or a stray file: nothing holds it
            remove_group(record.name)
            log.debug("removed placement group %s of %s", record.name, run_dir.name)
        record.unlink(missing_ok=True)
        cleared += 1
    return cleared


def remove_group(group_id: str) -> None:
    """Remove the placement group whose id is ``group_id`` (hex, as Ray prints it)."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))


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
            stopped = [trial for trial in trials if trial.status != "RUNNING"]
            for trial in stopped:
                remove_recorded_groups(run_dir_of(trial.trial_id))
            if stopped:
                remove_orphaned_groups()

        def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
            for trial in trials:
                remove_recorded_groups(run_dir_of(trial.trial_id))

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
