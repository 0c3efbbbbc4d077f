"""``rayft profile RUN``: where a run's step time went, per rank, with the verdict and its fix.

It reads a finished run's files (:mod:`rayft.training.profiling.report`) rather than calling
:mod:`rayft.api`: it takes a run directory, not a config, and runs nothing.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command(epilog="Example: rayft profile runs/my-run")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--margin",
    type=click.FloatRange(min=0, min_open=True),
    default=0.2,
    show_default=True,
    help="A rank slower than the median by more than this fraction is named a straggler.",
)
def profile(run_dir: Path, margin: float) -> None:
    """Summarise RUN_DIR's step breakdown per rank (profile/step_times.jsonl), say what bounds the run
    and what to change, and write profile/profile.html. `rayft jobs stacks JOB` shows a running
    job's Python stacks instead."""
    from rayft.training.profiling.report import load_profile, profile_text, write_profile_page

    check_run_dir(run_dir)
    found = load_profile(run_dir, margin)
    click.echo(profile_text(found))
    click.echo(f"Page: {write_profile_page(run_dir, found)}")


def check_run_dir(run_dir: Path) -> None:
    """RunStateError for a file given where a run's directory is expected, saying what is expected."""
    from rayft.errors import RunStateError

    if run_dir.is_file():
        raise RunStateError(
            f"{str(run_dir)!r} is a file; rayft profile takes a training run's directory (storage_path/name, "
            "holding profile/step_times.jsonl), e.g. rayft profile runs/my-run"
        )
