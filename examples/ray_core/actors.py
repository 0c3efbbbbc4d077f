"""Ray Core actors: a counter as a plain class, then the same class as a Ray actor.

What it teaches:
- a task is stateless; an actor is a class instance living in its own worker process, keeping state
  between calls;
- ``@ray.remote`` on a class makes ``Cls.remote()`` start that process and return a handle;
- ``handle.method.remote()`` returns a future; calls on one actor run one at a time, in the order sent,
  so many callers (here, tasks) can share a counter without a lock.

Run it (the number of increments is optional):

    python examples/ray_core/actors.py 10
"""

from __future__ import annotations

import argparse

import ray


class Counter:
    """A plain counter: its state lives in this process."""

    def __init__(self) -> None:
        self.value = 0

    def increment(self, by: int = 1) -> int:
        self.value += by
        return self.value

    def get(self) -> int:
        return self.value


# The same class as an actor: its state lives in a Ray worker process.
CounterActor = ray.remote(Counter)


@ray.remote
def add_from_task(counter: ray.actor.ActorHandle, times: int) -> None:
    """A task that calls the shared actor: handles can be passed to other tasks and actors."""
    ray.get([counter.increment.remote() for _ in range(times)])


def _start_ray(address: str | None, num_cpus: int) -> None:
    if address:
        ray.init(address=address)  # a cluster started with `ray start --head` or a remote one
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)  # a new Ray for this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", type=int, default=10, help="how many increments")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--address", help="an existing Ray cluster (e.g. auto); default: start a local one")
    args = parser.parse_args()

    plain = Counter()
    for _ in range(args.size):
        plain.increment()
    print(f"plain counter: {plain.get()}")

    _start_ray(args.address, args.num_cpus)
    actor = CounterActor.remote()
    values = ray.get([actor.increment.remote() for _ in range(args.size)])
    print(f"actor counter: {ray.get(actor.get.remote())} (each call saw {values})")

    # Two tasks share the one actor: every increment lands, none is lost to a race.
    ray.get([add_from_task.remote(actor, args.size) for _ in range(2)])
    print(f"after two tasks added {args.size} each: {ray.get(actor.get.remote())}")
    ray.shutdown()


if __name__ == "__main__":
    main()
