"""``rayft chat`` and ``rayft generate``: use a model, interactively or over a file of prompts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from rayft import api
from rayft.cli.address_opt import address_option
from rayft.cli.defaults import CHECKPOINT_HELP, config_default
from rayft.config import RayftConfig, load_config
from rayft.config.loader import validate_config


def _with_inference(cfg: RayftConfig, values: dict[str, Any]) -> RayftConfig:
    """``cfg`` with the inference fields the command line set (validated like the config file)."""
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
        click.option("--checkpoint", default=None, help=CHECKPOINT_HELP),
        click.option("--max-new-tokens", type=int, default=None,
                     help=f"Longest reply or completion, in tokens [{config_default('inference.max_new_tokens')}]."),
        click.option("--temperature", type=float, default=None,
                     help=f"Sampling temperature, 0 = greedy [{config_default('inference.temperature')}]."),
        click.option("--top-p", type=float, default=None,
                     help=f"Nucleus sampling mass [{config_default('inference.top_p')}]."),
        click.option("--seed", type=int, default=None, help=f"Sampling seed [{config_default('inference.seed')}]."),
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
@click.option(
    "--tool",
    "tools",
    multiple=True,
    type=click.Choice(["calculator", "sql", "python"]),
    help="A built-in tool the model may call (repeat for more): its calls are run and answered, shown as notes.",
)
def chat(source: str, overrides: tuple[str, ...], *, config_path: str | None, checkpoint: str | None,
         device: str, tools: tuple[str, ...], **sampling: Any) -> None:  # fmt: skip
    """Chat with a model in this process, with the chat template it was trained with.

    SOURCE is a run directory (--checkpoint picks its checkpoint), a checkpoints/step-N or final/
    directory, an exported model directory, a Hub id, a .gguf file or a built-in name.

    Replies stream as they are generated. Type /reset to clear the conversation, /system TEXT to set
    the system prompt (and start over), /help for the commands, /exit or Ctrl-D to quit; Ctrl-C stops
    the reply being generated. With standard input not a terminal, each line is a message and each
    reply is one block on standard output. No Ray is started.
    """
    cfg = _with_inference(_load(config_path, overrides, checkpoint), sampling)
    api.chat(cfg, source, device=None if device == "auto" else device, tools=tools)


@click.command(epilog="Example: rayft generate runs/my-run --input prompts.jsonl --output out.jsonl --temperature 0")
@click.argument("source")
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSON Lines file, one prompt per line: a 'prompt' string or a 'messages' list of chat turns.",
)
@click.option(
    "--output",
    "output_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSON Lines file written (atomically) with every usable input row and its generation.",
)
@click.option(
    "--field",
    "prompt_field",
    default=None,
    help="Column holding the prompt (a string, or a list of chat turns) [prompt, else messages].",
)
@click.option(
    "--rejects",
    "rejects_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where the rejected lines go, with line number, reason and text [OUTPUT's name .rejects.jsonl].",
)
@sampling_options
@click.option(
    "--backend",
    type=click.Choice(["hf", "vllm", "openai"]),
    default=None,
    help=f"Generation backend [{config_default('inference.backend')}]; openai sends SOURCE as the model name to "
    "inference.endpoint.base_url.",
)
@click.option(
    "--batch-size", type=int, default=None, help=f"Prompts per batch [{config_default('inference.batch_size')}]."
)
@click.option(
    "--num-workers", type=int, default=None, help=f"Model replicas on Ray [{config_default('inference.num_workers')}]."
)
@address_option("generate", as_job=False)
def generate(
    source: str,
    overrides: tuple[str, ...],
    *,
    input_path: str,
    output_path: str,
    prompt_field: str | None,
    rejects_path: str | None,
    config_path: str | None,
    checkpoint: str | None,
    **settings: Any,
) -> None:
    """Generate a completion for every prompt of a JSON Lines file, on a pool of Ray actors.

    SOURCE is a model as for rayft chat (a run directory, checkpoint, export, Hub id, .gguf file or
    built-in name), or with --backend openai the model name the server is asked for.

    The output keeps the input's order and other columns, and adds generation, finish_reason, error,
    num_prompt_tokens and num_generated_tokens. Lines that cannot be prompted (not JSON, no prompt,
    a wrong type) are listed with their line number, reason and text in the rejects file and counted
    in the summary; none is dropped silently. Chat prompts go through the model's chat template.
    """
    cfg = _with_inference(_load(config_path, overrides, checkpoint), settings)
    result = api.generate(
        cfg, source, input_path, output_path, prompt_field=prompt_field, rejects_path=rejects_path or None
    )
    click.echo(result.summary())
