"""``rayft data prepare CONFIG [KEY=VALUE]...``: tokenize and cache the training data, alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, overrides_argument
from rayft.runs.defaults import default_report_dir
from rayft.runs.layout import DATA_DIR

if TYPE_CHECKING:
    from rayft.data.prepare import PrepareResult


@click.group()
def data() -> None:
    """Prepare training data: read, render, tokenize, pack and cache it as parquet units."""


@data.command(epilog="Example: rayft data prepare cfg.yaml data.packing=true data.max_seq_length=2048")
@config_argument
@overrides_argument
@address_option("data-prepare")
@click.option(
    "--in-process",
    is_flag=True,
    help=(
        "Tokenize in this process instead of a Ray Data job across the cluster's CPUs (same output; data of "
        "2,048 examples or fewer is prepared in this process anyway)."
    ),
)
@click.option(
    "--report-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write rejected.jsonl and stats.json here (default: <storage_path>/<name>/data).",
)
def prepare(config_path: str, overrides: tuple[str, ...], in_process: bool, report_dir: str | None) -> None:
    """Tokenize the data of CONFIG into the content-keyed cache that `rayft train` reuses.

    Prints the cache key, the row counts, the rejected rows by reason and the token statistics.
    A second run with the same inputs reuses the cache without tokenizing.
    """
    from rayft import api

    cfg = load_cli_config(config_path, overrides)
    fix = "pass --report-dir /a/local/dir"
    reports = report_dir or default_report_dir(cfg, DATA_DIR, command="rayft data prepare", fix=fix)
    outcome = api.prepare_data(cfg, report_dir=reports, in_process=in_process)
    click.echo(summary(outcome, reports))


def summary(outcome: PrepareResult, report_dir: Any) -> str:
    """The text `rayft data prepare` prints: key, counts, rejections, token statistics."""
    from rayft.data.report import top_reasons

    prepared, stats = outcome.prepared, outcome.prepared.stats
    how = "reused the cached dataset (no tokenization)" if outcome.reused else f"prepared in {outcome.elapsed_s:.1f} s"
    validation = prepared.validation
    lines = [
        f"Data {prepared.key}: {how}",
        f"  cache:      {prepared.root}",
        *(f"  format:     {name}: {fmt}" for name, fmt in stats["formats"].items()),
        f"  rows:       {stats['rows_total']} read, {stats['rows']['train']} train, "
        f"{stats['rows']['validation']} validation",
        f"  rejected:   {stats['rejected_total']}"
        + "".join(f"\n    {reason}: {count}" for reason, count in top_reasons(stats)),
        f"  units:      {prepared.train.num_units} train ({prepared.train.num_examples} examples), "
        f"{validation.num_units if validation else 0} validation" + (" (packed)" if prepared.packed else ""),
        f"  tokens:     {stats['tokens_total']} train, {stats['label_tokens_total']} trained (labels)",
        "  lengths:    " + ", ".join(f"{k} {stats['length_percentiles'][k]}" for k in ("p50", "p90", "p99", "max")),
        f"  truncated:  {stats['truncated']} rows ({100 * stats['truncated_share']:.1f}%)",
    ]
    if "padding_efficiency" in stats:
        lines.append(f"  padding efficiency: {stats['padding_efficiency']:.3f}")
    lines.append(f"  report:     {report_dir}")
    return "\n".join(lines)
