"""``rayft tune CONFIG [KEY=VALUE]...``: a hyper-parameter search over fine-tuning runs on Ray Tune."""

from __future__ import annotations

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument


@click.command(epilog="Example: rayft tune configs/tune.yaml tune.num_samples=8 tune.scheduler=asha")
@config_argument
@overrides_argument
@address_option("tune")
def tune(config_path: str, overrides: tuple[str, ...]) -> None:
    """Search the hyper-parameters of CONFIG's tune section: each trial is a full training run.

    The search space maps dotted config paths to domains (loguniform, uniform, randint, choice,
    grid); the scheduler (fifo, asha, hyperband, pbt) stops or copies trials on every evaluation.
    The sweep lives in <storage_path>/<tune.name>/: trials/<id>/ (each trial's run directory),
    tune.json, best.yaml (the best trial's config, runnable with `rayft train`) and tune.html.
    Rerunning the same command continues an interrupted sweep: finished trials are kept, the
    others continue from their last checkpoint.
    """
    cfg = load_cli_config(config_path, overrides)
    # The log goes with the sweep (the recipe refuses a config without a tune section, after this).
    sweep = None if cfg.tune is None else cfg.tune.sweep_name(cfg.name)
    open_run_log(cfg, run_name=sweep)
    outcome = api.tune(cfg)
    click.echo(outcome.table)
    click.echo(f"Sweep: {outcome.where} ({len(outcome.result.trials)} trials in {outcome.elapsed_s:.0f} s)")
    if outcome.best_config is not None:
        click.echo(f"Best config: {outcome.best_config}")
