"""``rayft chat`` and ``rayft generate``: use a model, interactively or over a file of prompts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from rayft.config import RayftConfig, load_config

_SOURCE_HELP = (
    "SOURCE is a run directory (--checkpoint picks its checkpoint), a checkpoints/step-N or final/ "
    "directory, an exported model directory, a Hub id, a .gguf file or a built-in name."
)
_CHECKPOINT_HELP = "Checkpoint of a run directory: latest (default), best (lowest eval/loss), final, or step-N."


def _with_inference(cfg: RayftConfig, values: dict[str, Any]) -> RayftConfig:
    """``cfg`` with the inference fields the command line set (validated like the config file)."""
    from rayft.config.loader import validate_config

    given = {key: value for key, value in values.items() if value is not None}
    if not given:
        return cfg
    raw = cfg.model_dump(mode="json")
    raw["inference"].update(given)
    return validate_config(raw, source="command-line options")


def _load(config_path: str | None, overrides: tuple[str, ...], checkpoint: str | None) -> RayftConfig:
    extra = [f"eval.checkpoint={checkpoint}"] if checkpoint else []
    return load_config(config_path, [*overrides, *extra])


def sampling_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by chat and generate: the config, the checkpoint and the sampling settings."""
    options = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="Config file (optional); its inference section gives the defaults of the options below."),
        click.option("--checkpoint", default=None, help=_CHECKPOINT_HELP),
        click.option("--max-new-tokens", type=int, default=None, help="Longest reply [inference.max_new_tokens: 512]."),
        click.option("--temperature", type=float, default=None,
                     help="Sampling temperature, 0 = greedy [inference.temperature: 0.7]."),
        click.option("--top-p", type=float, default=None, help="Nucleus sampling mass [inference.top_p: 0.9]."),
        click.option("--seed", type=int, default=None, help="Sampling seed [inference.seed: unset]."),
    ]  # fmt: skip
    return functools.reduce(lambda f, option: option(f), reversed(options), function)


@click.command(epilog="Example: rayft chat runs/my-run --checkpoint best --system 'You are terse.'")
@click.argument("source")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@sampling_options
@click.option("--system", "system_prompt", default=None, help="System prompt to start with [inference.system_prompt].")
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    help="Where the model runs (auto: a GPU when there is one).",
)
def chat(source: str, overrides: tuple[str, ...], *, config_path: str | None, checkpoint: str | None,
         device: str, **sampling: Any) -> None:  # fmt: skip
    """Chat with a model in this process, with the chat template it was trained with.

    Replies stream as they are generated. Type /reset to clear the conversation, /system TEXT to set
    the system prompt (and start over), /help for the commands, /exit or Ctrl-D to quit; Ctrl-C stops
    the reply being generated. With standard input not a terminal, each line is a message and each
    reply is one block on standard output. No Ray is started.
    """
    from rayft.recipes import chat as recipe

    cfg = _with_inference(_load(config_path, overrides, checkpoint), sampling)
    recipe.run(cfg, source, device=None if device == "auto" else device)
