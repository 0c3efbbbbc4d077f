"""``rayft run CONFIG [KEY=VALUE]...``: the whole pipeline — sdg, train, eval, export — from one config."""

from __future__ import annotations

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument
from rayft.data.builtin import builtin_eval_note

_STAGES = click.Choice(["sdg", "tune", "train", "pairs", "preference", "rl", "eval", "export"])


@click.command(epilog="Example: rayft run configs/quickstart.yaml train.max_steps=50 --from eval")
@config_argument
@overrides_argument
@click.option("--from", "from_stage", type=_STAGES, help="Rerun this stage and every later one, keeping earlier ones.")
@click.option("--only", type=_STAGES, help="Rerun this stage alone, using the earlier stages' outputs.")
@click.option("--force", is_flag=True, help="Rerun every selected stage even when its inputs did not change.")
@address_option("run")
def run(
    config_path: str,
    overrides: tuple[str, ...],
    from_stage: str | None,
    only: str | None,
    force: bool,
) -> None:
    """Run the stages CONFIG requests (sdg, train, pairs, preference, rl, eval, export) in order on one Ray.

    Each stage's outputs go to <storage_path>/<name>/<stage>/ with a fingerprint of its inputs; a
    rerun skips the stages whose inputs did not change. The run directory also gets lineage.json
    and report.html.
    """
    from rayft.pipeline.plan import StageDecision

    def announce(decision: StageDecision) -> None:
        verb = {"run": "running", "skip": "skipped", "reuse": "reused", "failed": "failed"}[decision.action]
        click.secho(f"== {decision.stage}: {verb} ({decision.reason})", fg="cyan", bold=True, err=True)

    cfg = load_cli_config(config_path, overrides)
    open_run_log(cfg)
    result = api.run_pipeline(cfg, from_stage=from_stage, only=only, force=force, on_decision=announce)
    click.echo("stage       action  seconds")
    for decision in result.decisions:
        click.echo(f"{decision.stage:<11} {decision.action:<7} {result.elapsed_s.get(decision.stage, 0.0):>7.1f}")
    comparison = result.comparison()
    headline = comparison.headline() if comparison is not None else None
    if headline:
        click.echo(headline)
        seeds = [cfg.sdg.seeds.path] if "sdg" in cfg.model_fields_set else []
        note = builtin_eval_note([ds.path for ds in cfg.eval.datasets], seeds)
        if note:
            click.echo(f"Note: {note}")
    click.echo(f"Report: {result.report_path}\nLineage: {result.lineage_path}")
