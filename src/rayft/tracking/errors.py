"""Errors and checks shared by the trackers: missing extras, unreachable servers, W&B keys."""

from __future__ import annotations

import importlib.util
import os
import urllib.error
import urllib.request

from rayft.errors import ConfigError
from rayft.security import mask_uri


class TrackerUnavailableError(ConfigError):
    """A tracker that the config requires cannot be used."""


def require_extra(module: str, extra: str) -> None:
    """Raise naming the pip install line when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise TrackerUnavailableError(
            f"logging.{extra} is set but the {module!r} package is not installed; "
            f"pip install 'rayft[{extra}]' (or remove logging.{extra})"
        )


def probe_http(uri: str, timeout_s: float = 5.0) -> None:
    """Raise naming ``uri`` when an http(s) tracking server does not answer its health check."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackerUnavailableError(
            f"logging.mlflow.tracking_uri: the MLflow server at {mask_uri(uri)} is unreachable ({reason}); start it "
            "or fix the URI, or set logging.mlflow.required=false to train without it"
        ) from None


def check_wandb_key(mode: str) -> None:
    """W&B online mode needs ``WANDB_API_KEY`` (or a ``wandb login``); say how to go offline."""
    if mode != "online" or os.environ.get("WANDB_API_KEY"):
        return
    netrc = os.path.expanduser("~/.netrc")
    if os.path.isfile(netrc) and "api.wandb.ai" in open(netrc, encoding="utf-8").read():  # noqa: SIM115
        return
    raise TrackerUnavailableError(
        "logging.wandb.mode is 'online' but WANDB_API_KEY is not set; export WANDB_API_KEY=..., or log offline "
        "with logging.wandb.mode=offline (then `wandb sync` the run directory's wandb/ later)"
    )
