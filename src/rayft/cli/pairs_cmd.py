"""``rayft pairs CONFIG [KEY=VALUE]... [--model SOURCE] [--problems N] [-k K]``: preference pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rayft import api
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument


@click.command(epilog="Example: rayft pairs configs/gsm8k-dpo.yaml --model runs/gsm8k-dpo/train --problems 50 -k 4")
@config_argument
@overrides_argument
@click.option("--model", "model", metavar="SOURCE", help="The model that answers: a run, final/, model dir or Hub id.")
@click.option("--problems", "num_problems", type=click.IntRange(min=1), help="Problems to use (pairs.num_problems).")
@click.option(
    "-k", "samples", type=click.IntRange(min=2), help="Answers sampled per problem (pairs.samples_per_problem)."
)
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where to write (default: pairs.output_dir).")
def pairs(  # noqa: PLR0917 - click passes every option positionally by name
    config_path: str,
    overrides: tuple[str, ...],
    model: str | None,
    num_problems: int | None,
    samples: int | None,
    output_dir: str | None,
) -> None:
    """Make preference pairs from a model's verified answers to the problems of CONFIG.

    Samples k answers per problem, checks each against the reference's '#### N' with the GSM8K
    checker of rayft eval, and writes data.jsonl (prompt, chosen, rejected: a correct and a wrong
    answer), no_pair.jsonl (each problem that gave no pair, with the reason) and summary.json.
    """
    extra = [f"pairs.num_problems={num_problems}"] if num_problems else []
    extra += [f"pairs.samples_per_problem={samples}"] if samples else []
    cfg = load_cli_config(config_path, (*overrides, *extra))
    open_run_log(cfg, Path(output_dir) if output_dir else None)
    result = api.pairs(cfg, model, output_dir=output_dir or None)
    click.echo(format_counts(result.summary))
    click.echo(f"\nPairs:    {result.data_jsonl}\nNo pair:  {result.no_pair_jsonl}\nSummary:  {result.summary_json}")


def format_counts(summary: dict[str, Any]) -> str:
    """The counts as plain text: problems with pairs, and those without by reason."""
    lines = [
        f"Problems: {summary['problems']}, {summary['problems_with_pairs']} gave {summary['pairs']} pair(s)",
        f"Samples:  {summary['samples']} ({summary['correct_samples']} correct, {summary['wrong_samples']} wrong "
        f"of which {summary['unparseable_samples']} unparseable, {summary['failed_samples']} failed)",
    ]
    if summary["no_pair"]:
        lines += ["No pair:"] + [f"  {reason:<24}{count:>8}" for reason, count in summary["no_pair"].items()]
    return "\n".join(lines)
