"""``rayft train CONFIG [KEY=VALUE]... [--resume]``: fine-tune a model on Ray Train."""

from __future__ import annotations

import click

from rayft.cli.common import config_argument, load_cli_config, overrides_argument


@click.command(epilog="Any config field can be overridden: rayft train cfg.yaml train.learning_rate=1e-4 lora.r=8")
@config_argument
@overrides_argument
@click.option("--resume", is_flag=True, help="Continue the run named in the config from its last complete checkpoint.")
def train(config_path: str, overrides: tuple[str, ...], resume: bool) -> None:
    """Fine-tune the model of CONFIG (LoRA or full) on its data, on Ray Train workers.

    Writes <storage_path>/<name>/: config.yaml, metrics.jsonl, tensorboard/, checkpoints/step-N/
    and final/, which loads with from_pretrained (full) or PeftModel.from_pretrained (LoRA).
    """
    from rayft.recipes.train import run

    cfg = load_cli_config(config_path, overrides)
    result = run(cfg, resume=resume)
    loss = f"{result.eval_loss:.4f}" if result.eval_loss is not None else "n/a"
    click.echo(
        f"Trained {result.steps} steps in {result.elapsed_s:.0f} s; validation loss {loss}.\n"
        f"Model: {result.final_dir}\nMetrics: {result.run_dir / 'metrics.jsonl'}"
    )
