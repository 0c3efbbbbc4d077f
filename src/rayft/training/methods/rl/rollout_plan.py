"""Decisions of rollouts on generation actors, apart from the actors themselves: which actors a training
worker owns, which actor samples which micro-batch, how stale a rollout is, and what a wait that ran out
says. Pure: no Ray, no torch."""

from __future__ import annotations


def owned_actors(num_actors: int, world_size: int, rank: int) -> list[int]:
    """The indices of the actors training worker ``rank`` owns: every ``world_size``-th from ``rank``
    (the config asks for at least one actor per worker)."""
    return [index for index in range(num_actors) if index % world_size == rank]


def actor_of(batch_index: int, num_owned: int) -> int:
    """The owned actor (by position) that samples a step's ``batch_index``-th micro-batch: round robin."""
    return batch_index % num_owned


def staleness(step: int, version: int) -> int:
    """How many optimizer steps the weights that sampled ``step``'s rollout lag behind the policy that
    trains on it (which has taken ``step - 1`` steps): 0 for synchronous rollouts."""
    return step - 1 - version


def timeout_message(what: str, seconds: float, field: str, cause: str) -> str:
    """The one line a run ends with when a wait on a generation actor ran out."""
    return (
        f"{what} did not finish within {seconds:g} s (train.rl.rollout.{field}); raise "
        f"train.rl.rollout.{field} if that is too short; likely cause: {cause}"
    )
