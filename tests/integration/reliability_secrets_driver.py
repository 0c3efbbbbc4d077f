"""Runs rayft commands (the CLI, in this process) one after the other on one local Ray that rayft
starts (as each command would: with its worker set-up hook), then writes what Ray stored about the
job (its runtime environment and job table) to the file named by argv[1], so that the secrets test
can grep it with the commands' files. argv[2:] are the commands' CLI arguments, separated by ``::``;
each command's exit status is printed as ``exit <status>: <command>``."""

from __future__ import annotations

import json
import sys


def commands(argv: list[str]) -> list[list[str]]:
    """The CLI argument lists of ``argv``, split at ``::``."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == "::":
            groups.append([])
        else:
            groups[-1].append(arg)
    return [g for g in groups if g]


def run_cli(args: list[str]) -> int:
    """One CLI command, as ``rayft ARGS`` runs it; its exit status."""
    from rayft.cli.main import cli

    try:
        cli.main(args=args, prog_name="rayft", standalone_mode=False)
    except SystemExit as exc:  # the CLI's exit 2 after an `Error:` line
        return int(exc.code or 0)
    return 0


def main() -> int:
    import ray
    import ray._private.state

    from rayft.runtime import ray_runtime

    with ray_runtime():
        try:
            for args in commands(sys.argv[2:]):
                status = run_cli(args)
                print(f"exit {status}: {args[0]}", flush=True)
        finally:
            stored = {"runtime_env": ray.get_runtime_context().runtime_env, "jobs": ray._private.state.jobs()}
            with open(sys.argv[1], "w", encoding="utf-8") as handle:
                json.dump(stored, handle, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
