"""Ray Core tasks: the same slow function run one call after another, then in parallel.

What it teaches:
- ``@ray.remote`` turns a plain function into a task that Ray runs in a worker process;
- calling ``fn.remote(...)`` returns at once with an ``ObjectRef`` (a future), not the result;
- ``ray.get`` waits for the futures, so starting every task before waiting runs them side by side.

Run it (the number of items is optional; each item takes DELAY seconds):

    python examples/ray_core/tasks.py 8
    python examples/ray_core/tasks.py 8 --delay 0.5 --num-cpus 4
    ray start --head && python examples/ray_core/tasks.py 8 --address auto   # on a running cluster
"""

from __future__ import annotations

import argparse
import time

import ray


def slow_square(x: int, delay: float) -> int:
    """Stands for any slow step (a download, a model call, a heavy computation)."""
    time.sleep(delay)
    return x * x


# The same function as a Ray task; ray.remote(fn) leaves the plain function usable too.
slow_square_task = ray.remote(slow_square)


def run_serial(items: list[int], delay: float) -> list[int]:
    return [slow_square(x, delay) for x in items]


def run_parallel(items: list[int], delay: float) -> list[int]:
    futures = [slow_square_task.remote(x, delay) for x in items]  # every task starts now
    return ray.get(futures)  # results come back in the order of the futures


def _start_ray(address: str | None, num_cpus: int) -> None:
    if address:
        ray.init(address=address)  # a cluster started with `ray start --head` or a remote one
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)  # a new Ray for this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", type=int, default=8, help="how many items to process")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds one item takes")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray (tasks running at once)")
    parser.add_argument("--address", help="an existing Ray cluster (e.g. auto); default: start a local one")
    args = parser.parse_args()
    items = list(range(args.size))

    _start_ray(args.address, args.num_cpus)
    ray.get(slow_square_task.remote(0, 0.0))  # start a worker first, so start-up is not timed below

    start = time.perf_counter()
    serial = run_serial(items, args.delay)
    serial_s = time.perf_counter() - start

    start = time.perf_counter()
    parallel = run_parallel(items, args.delay)
    parallel_s = time.perf_counter() - start

    assert parallel == serial, "the tasks must compute what the plain loop computes"
    print(f"results:  {parallel}")
    print(f"serial:   {serial_s:.2f} s ({args.size} items x {args.delay} s)")
    print(f"parallel: {parallel_s:.2f} s with at most {args.num_cpus} at once ({serial_s / parallel_s:.1f}x faster)")
    ray.shutdown()


if __name__ == "__main__":
    main()
