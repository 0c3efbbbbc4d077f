"""``rayft train CONFIG [KEY=VALUE]... [--resume]``: fine-tune a model on Ray Train."""

from __future__ import annotations

import shlex
import sys

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.common import config_argument, load_cli_config, open_run_log, overrides_argument
from rayft.errors import RunInterruptedError, WorkersLostError
from rayft.security import redact

# 128 + SIGTERM, as a shell reports a process ended by SIGTERM; schedulers treat it as preempted.
SIGTERM_EXIT_CODE = 143
# EX_TEMPFAIL of sysexits.h: the run's workers died more often than failure.max_failures allows
# (killed, out of memory, a node lost); trying again (--resume) may well succeed.
WORKERS_LOST_EXIT_CODE = 75


@click.command(epilog="Any config field can be overridden: rayft train cfg.yaml train.learning_rate=1e-4 lora.r=8")
@config_argument
@overrides_argument
@address_option("train")
@click.option("--resume", is_flag=True, help="Continue the run named in the config from its last complete checkpoint.")
def train(config_path: str, overrides: tuple[str, ...], resume: bool) -> None:
    """Fine-tune the model of CONFIG (LoRA or full) on its data, on Ray Train workers.

    Writes <storage_path>/<name>/: config.yaml, metrics.jsonl, tensorboard/, checkpoints/step-N/
    and final/, which loads with from_pretrained (full) or PeftModel.from_pretrained (LoRA).
    A URI storage_path (s3://, gs://...) is uploaded as it goes by the workers, from their own nodes;
    the driver keeps a local mirror (config, data report, and final/ fetched at the end).
    On SIGTERM it saves a checkpoint, prints how to resume, and exits with code 143. A worker that
    dies is restarted from the last checkpoint up to failure.max_failures times; past that it prints
    what happened and the --resume command, and exits with code 75.
    Started by torchrun (`torchrun --nproc-per-node N --no-python rayft train CONFIG`), each process
    trains as one of the scaling.num_workers ranks, without Ray.
    """
    from rayft.models.hub import check_trainable_model
    from rayft.training.driver.torchrun import launched_by_torchrun

    cfg = load_cli_config(config_path, overrides)
    if cfg.task.path is None:  # a model that cannot be had here is refused before the run directory is touched
        check_trainable_model(cfg.model.name)
    open_run_log(cfg)
    try:
        if launched_by_torchrun():  # one rank of `torchrun --no-python rayft train CONFIG`
            result = api.train_rank(cfg, resume=resume)
            if result is None:  # only rank 0 reports
                return
        else:
            result = api.train(cfg, resume=resume)
    except RunInterruptedError as exc:  # SIGTERM: a clean stop after a save, not a failure
        click.echo(f"Stopped: {exc}", err=True)
        sys.exit(SIGTERM_EXIT_CODE)
    except WorkersLostError as exc:
        click.secho(f"Error: {exc.paragraph(resume_command(config_path, overrides))}", fg="red", err=True)
        sys.exit(WORKERS_LOST_EXIT_CODE)
    loss = f"{result.eval_loss:.4f}" if result.eval_loss is not None else "n/a"
    click.echo(
        f"Trained {result.steps} steps in {result.elapsed_s:.0f} s; validation loss {loss}.\n"
        f"Model: {result.final_dir}\nMetrics: {result.run_dir / 'metrics.jsonl'}"
    )
    if result.storage_uri:
        click.echo(f"Stored at: {result.storage_uri}")


def resume_command(config_path: str, overrides: tuple[str, ...]) -> str:
    """The command that continues this run: the same config and overrides, with ``--resume``
    (credentials in an override masked)."""
    return redact(shlex.join(["rayft", "train", config_path, *overrides, "--resume"]))
