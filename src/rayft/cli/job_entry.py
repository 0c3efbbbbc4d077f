"""The entrypoint of a rayft Ray Job, on the cluster: find the config uploaded with the job, check
that the credential variables it was told to expect are set there, then run the rayft command.

``python -m rayft.cli.job_entry --config-module M [--require-env NAME]... -- COMMAND [ARGS]...``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from rayft.cli.main import cli
from rayft.cluster.job_plan import CONFIG_FILE


def config_path(module: str) -> Path:
    """The config file uploaded with the job in package ``module``."""
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise SystemExit(
            f"Error: the job's config package {module!r} is not on this node's path (runtime_env py_modules)"
        )
    return Path(locations[0]) / CONFIG_FILE


def missing_env(names: list[str], environ: os._Environ[str] | dict[str, str]) -> list[str]:
    """The names among ``names`` that are unset or empty in ``environ``."""
    return [name for name in names if not environ.get(name)]


def main(argv: list[str] | None = None) -> None:
    """Run the job's rayft command; exits with the command's status."""
    parser = argparse.ArgumentParser(prog="python -m rayft.cli.job_entry")
    parser.add_argument("--config-module", required=True)
    parser.add_argument("--require-env", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    missing = missing_env(args.require_env, os.environ)
    if missing:
        print(
            f"Error: the job needs {', '.join(missing)} in the cluster's environment and it is not set there. "
            "rayft never sends credential values with a job: export them on every node before `ray start` "
            "(or, on Kubernetes, from a Secret in the pod spec), then submit again.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if args.require_env:
        print(f"Credentials found in the cluster's environment: {', '.join(args.require_env)}", file=sys.stderr)
    words, rest = _split(command)
    config = config_path(args.config_module)
    print(f"rayft {' '.join(words)} {config} {' '.join(rest)}".rstrip(), file=sys.stderr, flush=True)
    cli.main(args=[*words, str(config), *rest], prog_name="rayft")


def _split(command: list[str]) -> tuple[list[str], list[str]]:
    """The command words (``train``; ``data prepare``) and the options after them."""
    words = command[:2] if command[:1] == ["data"] else command[:1]
    return words, command[len(words) :]


if __name__ == "__main__":
    main()
