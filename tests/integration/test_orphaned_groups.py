"""A placement group whose creating actor was killed (as Ray's memory monitor kills Ray Train's
controller) is removed by :func:`rayft._ray_private.remove_orphaned_groups`, and no other group is:
not a live actor's, not the driver's own."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_the_group_of_a_killed_actor_is_removed_and_a_live_actors_group_is_kept(ray_session: None) -> None:
    import ray
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from rayft._ray_private import remove_orphaned_groups

    @ray.remote(num_cpus=0)
    class Reserver:
        def reserve(self) -> str:
            group = ray.util.placement_group([{"CPU": 0.01}])
            ray.get(group.ready())
            return str(group.id.hex())

    own = ray.util.placement_group([{"CPU": 0.01}])  # the driver's own (as the launcher's resource check makes)
    ray.get(own.ready())
    doomed, alive = Reserver.remote(), Reserver.remote()  # type: ignore[attr-defined]
    orphan, kept = ray.get(doomed.reserve.remote()), ray.get(alive.reserve.remote())
    ray.kill(doomed)
    deadline = time.monotonic() + 60
    removed: list[str] = []
    while orphan not in removed and time.monotonic() < deadline:  # until the GCS marks its creator dead
        removed += remove_orphaned_groups()
        time.sleep(0.2)
    assert removed == [orphan]
    assert placement_group_table()[orphan]["state"] == "REMOVED"
    assert placement_group_table()[kept]["state"] == "CREATED"
    assert placement_group_table()[own.id.hex()]["state"] == "CREATED"
    remove_placement_group(own)
    remove_placement_group(_group(kept))
    ray.kill(alive)


def _group(group_id: str) -> Any:
    import ray
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))


def test_after_a_sweep_the_groups_of_its_ended_trials_are_removed_and_a_live_one_is_reported(
    ray_session: None,
) -> None:
    """As Tune ends a stopped trial's process mid-way (its reservation probe not freed), and Ray marks
    it dead a moment later: :func:`rayft.tuning.reaper.settle_groups` waits for that and removes the
    group; a group made during the sweep whose maker still lives is waited for, then reported."""
    import ray
    from ray.util.placement_group import placement_group_table

    from rayft._ray_private import actor_made_groups
    from rayft.tuning.reaper import settle_groups

    @ray.remote(num_cpus=0)
    class Trial:
        def reserve(self) -> str:
            group = ray.util.placement_group([{"CPU": 0.01}])
            ray.get(group.ready())
            return str(group.id.hex())

    before = set(actor_made_groups())
    ended, running = Trial.remote(), Trial.remote()  # type: ignore[attr-defined]
    left, held = ray.get(ended.reserve.remote()), ray.get(running.reserve.remote())
    ray.kill(ended, no_restart=True)
    deadline = time.monotonic() + 60
    while not actor_made_groups().get(left) and time.monotonic() < deadline:  # until the GCS marks it dead
        time.sleep(0.1)
    assert settle_groups(before, timeout_s=0.0) == [held]
    assert placement_group_table()[left]["state"] == "REMOVED"
    assert placement_group_table()[held]["state"] == "CREATED"
    ray.kill(running)
    assert settle_groups(before, timeout_s=60.0) == []
    assert placement_group_table()[held]["state"] == "REMOVED"
