"""``rayft serve``: models behind an OpenAI-compatible API on Ray Serve, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from rayft import api
from rayft.cli.address_opt import LOCAL_HELP
from rayft.config import load_config
from rayft.config.loader import OVERRIDE_KEY


@click.command(epilog="Example: rayft serve runs/run-a runs/run-b --config serve.yaml --port 8000 serve.num_replicas=2")
@click.argument("arguments", nargs=-1, metavar="[SOURCE]... [KEY=VALUE]...")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Config file (optional): its serve section (replicas, batching, adapters, address).",
)
@click.option("--host", default=None, help="Address to listen on [serve.host: 127.0.0.1].")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="HTTP port, 0 for a free one [serve.port: 8000]."
)
@click.option("--address", default=None, metavar="ADDRESS", help=LOCAL_HELP)
def serve(arguments: tuple[str, ...], *, config_path: str | None, host: str | None, port: int | None,
          address: str | None) -> None:  # fmt: skip
    """Serve models with an OpenAI-compatible API (/v1/models, /v1/chat/completions, /v1/completions).

    SOURCE is a pipeline run directory (`rayft run`'s output: its final model, named after the run),
    a run directory (eval.checkpoint picks its checkpoint), a checkpoints/step-N or final/
    directory, an exported model directory, a Hub id or a built-in name; each is served under a model
    id printed at start (with no SOURCE, serve.sources of the config). LoRA adapters of one base model
    share its replicas, loaded on demand by model id. Any config field can be set after the sources
    (serve.max_batch_size=8), as in chat and generate.
    Blocks until Ctrl-C (SIGINT) or SIGTERM, then lets the requests in flight finish (up to
    serve.graceful_shutdown_timeout_s), stops the Ray it started and exits 0. Keys (optional) come
    from the variable serve.api_keys_env (RAYFT_API_KEYS) or serve.api_keys_file, never from here.
    """
    sources, overrides = split_overrides(arguments)
    cfg = load_config(config_path, overrides)
    handle = api.serve(cfg, sources, host=host, port=port, address=address)
    with handle:
        stopping = _stop_on_signals()
        click.echo(f"Serving at {handle.base_url}")
        click.echo(f"Models: {', '.join(handle.model_ids)}")
        for model_id, path in handle.served_from.items():
            if path != model_id:
                click.echo(f"  {model_id}: {path}")
        click.echo("Press Ctrl-C to stop.")
        stopping.wait()
        grace = cfg.serve.graceful_shutdown_timeout_s
        click.echo(f"Stopping: finishing the requests in flight (up to {grace:g} s)...")
    click.echo("Stopped.")


def split_overrides(arguments: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The sources and the ``section.key=value`` overrides among the arguments: an argument whose part before
    the first ``=`` is a dotted name is an override (a path or Hub id has a ``/`` or no ``=``)."""
    overrides = [arg for arg in arguments if OVERRIDE_KEY.fullmatch(arg.partition("=")[0]) and "=" in arg]
    return tuple(arg for arg in arguments if arg not in overrides), overrides


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM, whichever comes first; later ones are ignored while draining.

    Both are handled here, after Ray has started: Ray's own SIGTERM handler kills its processes at
    once (cutting the requests in flight), and a script's background job starts with SIGINT ignored.
    """
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    for kind in (signal.SIGINT, signal.SIGTERM):
        signal.signal(kind, stop)
    return stopping
