"""``rayft serve``: models behind an OpenAI-compatible API on Ray Serve, until Ctrl-C."""

from __future__ import annotations

import threading

import click

from rayft import api
from rayft.cli.address_opt import LOCAL_HELP
from rayft.config import load_config


@click.command(epilog="Example: rayft serve runs/run-a runs/run-b --config serve.yaml --port 8000")
@click.argument("sources", nargs=-1, metavar="[SOURCE]...")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (optional): its serve section (replicas, batching, adapters, address).",
)
@click.option("--host", default=None, help="Address to listen on [serve.host: 127.0.0.1].")
@click.option("--port", type=int, default=None, help="HTTP port, 0 for a free one [serve.port: 8000].")
@click.option("--address", default=None, metavar="ADDRESS", help=LOCAL_HELP)
def serve(sources: tuple[str, ...], *, config_path: str | None, host: str | None, port: int | None,
          address: str | None) -> None:  # fmt: skip
    """Serve models with an OpenAI-compatible API (/v1/models, /v1/chat/completions, /v1/completions).

    SOURCE is a run directory (eval.checkpoint picks its checkpoint), a checkpoints/step-N or final/
    directory, an exported model directory, a Hub id or a built-in name; each is served under a model
    id printed at start (with no SOURCE, serve.sources of the config). LoRA adapters of one base model
    share its replicas, loaded on demand by model id.
    Blocks until Ctrl-C, then lets the requests in flight finish.
    """
    cfg = load_config(config_path, [])
    host = host if host is not None else cfg.serve.host
    handle = api.serve(list(sources), config=cfg, host=host, port=port if port is not None else cfg.serve.port,
                       address=address)  # fmt: skip
    with handle:
        click.echo(f"Serving at {handle.base_url}")
        click.echo(f"Models: {', '.join(handle.model_ids)}")
        click.echo("Press Ctrl-C to stop.")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            click.echo("Stopping: finishing the requests in flight...")
