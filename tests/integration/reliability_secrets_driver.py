"""Runs rayft commands (the CLI, in this process) one after the other on one local Ray that rayft
starts (as each command would: with its worker set-up hook), then writes what Ray stored about the
job (its runtime environment and job table) to the file named by argv[1], so that the secrets test
can grep it with the commands' files. argv[2:] are the commands' CLI arguments, separated by ``::``;
each command's output is framed by ``begin: <command>`` and ``exit <status>: <command>`` lines.

What the first command shows matches a real ``rayft`` process: its ``begin`` line comes before Ray
starts, and, as ``rayft`` does before its command starts Ray, the console and the redaction are set up
first, in the environment that Ray's processes inherit (no Hugging Face progress bars, rayft's quiet
mode). Run with stderr joined to stdout, each command's lines stay between its frame."""

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

    from rayft.console import setup_console
    from rayft.runtime import ray_runtime
    from rayft.security import install_redaction

    groups = commands(sys.argv[2:])
    print(f"begin: {groups[0][0]}", flush=True)
    install_redaction()
    setup_console()
    with ray_runtime():
        try:
            for index, args in enumerate(groups):
                if index:
                    print(f"begin: {args[0]}", flush=True)
                status = run_cli(args)
                print(f"exit {status}: {args[0]}", flush=True)
        finally:
            stored = {"runtime_env": ray.get_runtime_context().runtime_env, "jobs": ray._private.state.jobs()}
            with open(sys.argv[1], "w", encoding="utf-8") as handle:
                json.dump(stored, handle, default=repr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
