"""A training driver for the chaos tests, run as a subprocess so that it can be killed.

``python -m tests.chaos.driver PREPARED_DIR MODEL_DIR STORAGE [--resume] [--address GCS] [KEY=VALUE]...``
runs the training launcher exactly as ``rayft train`` does after data preparation (the same
run-directory claim, worker plan, launcher and SIGTERM handling), on units already prepared by
the test. Exit codes: 0 done, 2 a rayft error, 143 stopped on SIGTERM after saving.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run one training launch; return the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("prepared")
    parser.add_argument("model")
    parser.add_argument("storage")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--address", default=None)
    args = parser.parse_args(argv)

    from rayft.console import setup_console
    from rayft.data.prepared import PreparedData
    from rayft.errors import RayftError, RunInterruptedError
    from rayft.runtime import ray_runtime
    from tests.support.runs import tiny_config, train_on

    setup_console()  # the console of `rayft train`: rayft's lines and warnings, Ray's report off it

    prepared = PreparedData.load(args.prepared)
    assert prepared is not None, args.prepared
    cfg = tiny_config(Path(args.model), Path(args.storage), *args.overrides)
    runtime = ray_runtime(args.address) if cfg.scaling.num_workers > 0 else contextlib.nullcontext()
    try:
        with runtime:
            run_dir = train_on(cfg, prepared, resume=args.resume)
    except RunInterruptedError as exc:
        print(f"Stopped: {exc}", file=sys.stderr, flush=True)
        return 143
    except RayftError as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"DONE {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
