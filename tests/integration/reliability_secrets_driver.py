"""Runs ``rayft train`` (the CLI, in this process) on a fresh local Ray, then writes what Ray stored
about the job (its runtime environment and job table) to the file named by argv[1], so that the
secrets test can grep it with the run's files. argv[2:] are the CLI arguments."""

from __future__ import annotations

import json
import sys


def main() -> int:
    import ray
    import ray._private.state

    from rayft.cli.main import cli

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        try:
            cli.main(args=sys.argv[2:], prog_name="rayft", standalone_mode=False)
        finally:
            stored = {"runtime_env": ray.get_runtime_context().runtime_env, "jobs": ray._private.state.jobs()}
            with open(sys.argv[1], "w", encoding="utf-8") as handle:
                json.dump(stored, handle, default=repr)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
