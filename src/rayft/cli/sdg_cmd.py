"""``rayft sdg CONFIG [KEY=VALUE]... [--test-mode] [--seeds N] [--variations K]``: synthetic data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument
from rayft.config.sdg import TEST_MODE_SEEDS


@click.command(epilog="Example: rayft sdg configs/sdg.yaml --seeds 50 --variations 3 sdg.generator=symbolic")
@config_argument
@overrides_argument
@address_option("sdg")
@click.option("--test-mode", is_flag=True, help=f"A smoke run on {TEST_MODE_SEEDS} seeds (seconds).")
@click.option("--seeds", "num_seeds", type=click.IntRange(min=1), help="Number of seeds to use (sdg.num_seeds).")
@click.option("--variations", type=click.IntRange(min=1), help="New rows per seed (sdg.variations).")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where to write (default: sdg.output_dir).")
def sdg(  # noqa: PLR0917 - click passes every option positionally by name
    config_path: str,
    overrides: tuple[str, ...],
    test_mode: bool,
    num_seeds: int | None,
    variations: int | None,
    output_dir: str | None,
) -> None:
    """Generate verified synthetic training rows from the seed problems of CONFIG.

    Writes data.parquet, data.jsonl (columns question, answer and provenance), rejected.jsonl
    (every rejected row with its stage and reason) and summary.json. Rerunning the same command
    after an interruption skips the seeds already written.
    """
    extra = [f"sdg.num_seeds={num_seeds}"] if num_seeds else []
    extra += [f"sdg.variations={variations}"] if variations else []
    cfg = load_cli_config(config_path, (*overrides, *extra))
    open_run_log(cfg, Path(output_dir) if output_dir else None)
    result = api.sdg(cfg, output_dir=output_dir or None, test_mode=test_mode)
    click.echo(format_summary(result.summary))
    click.echo(f"\nAccepted: {result.data_jsonl}\nRejected: {result.rejected_jsonl}\nSummary:  {result.summary_json}")


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a plain-text table: stages, rejection reasons, rates and times."""
    seeds, rows = summary["seeds"], summary["rows"]
    lines = [
        f"Seeds: {seeds['processed']} processed ({seeds['done_before_this_run']} from an earlier run), "
        f"{seeds['skipped']} unusable",
        "",
        f"{'stage':<16}{'rows in':>10}{'rejected':>10}{'rows out':>10}",
    ]
    lines += [f"{s['stage']:<16}{s['rows_in']:>10}{s['rejected']:>10}{s['rows_out']:>10}" for s in summary["stages"]]
    rate = summary["acceptance_rate"]
    lines += ["", f"Accepted {rows['accepted']} of {rows['requested']} requested rows ({rate:.1%})"]
    if summary["rejection_reasons"]:
        lines += ["", "Rejection reasons:"]
        lines += [f"  {reason:<40}{count:>8}" for reason, count in summary["rejection_reasons"].items()]
    lines += ["", f"Tokens generated: {summary['tokens_generated']}"]
    lines += ["Seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in summary["wall_seconds"].items())]
    return "\n".join(lines)
