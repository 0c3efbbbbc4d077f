"""Whether a model can be had on this machine before anything tries to load it.

A Hub id is available when the local Hugging Face cache holds it or the Hub answers; offline
(``HF_HUB_OFFLINE=1``, or no answer within :data:`PROBE_TIMEOUT_S`) a missing one is refused at
once with the names this machine has and a "did you mean", instead of transformers' minute of
retries. A local directory must hold a readable ``config.json`` and, to be tokenized, tokenizer
files. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from rayft.errors import ModelError
from rayft.models.registry import BUILTIN_MODELS
from rayft.models.resolve import resolve_model_source

PROBE_TIMEOUT_S = 2.0
"""How long the Hub gets to accept a connection before this machine is taken to be offline."""

_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def check_model_available(name: str, *, setting: str = "model.name") -> None:
    """Refuse a model that cannot be loaded here: a Hub id offline and not cached, or a local
    directory whose ``config.json`` is unreadable. ``setting`` names where the name came from.

    Raises:
        ModelError: naming the model, why, the names this machine has, and the fix.
    """
    source = resolve_model_source(name)
    if source.kind == "local" and (Path(source.location) / "config.json").is_file():
        read_model_config(Path(source.location), setting=setting)  # a tokenizer's directory may have none
    if source.kind != "hub" or name in cached_hub_models():
        return
    reason = hub_unavailable_reason()
    if reason is None:
        return
    known = [*BUILTIN_MODELS, *cached_hub_models()]
    raise ModelError(
        f"{setting}: {name!r} is not a local directory, a .gguf file or a built-in name, and as a Hub id it is not in "
        f"the Hugging Face cache ({hub_cache_dir()}) while {reason}.{did_you_mean(name, known)} Models this machine "
        f"has: {', '.join(known)}. Give one of them, a local model directory, or download it where the Hub can be "
        f"reached (huggingface-cli download {name})"
    )


def check_trainable_model(name: str, *, setting: str = "model.name") -> None:
    """Refuse what training cannot start from: what :func:`check_model_available` refuses, and a local
    directory that holds a LoRA adapter or a run rather than a model (training reads ``config.json``;
    without this, transformers fails on every worker with "Unrecognized model", and each retry again).

    Raises:
        ModelError: naming the directory, what it holds, and the command that makes a model of it.
    """
    check_model_available(name, setting=setting)
    directory = Path(name).expanduser()
    if not directory.is_dir() or (directory / "config.json").is_file():
        return
    holds = "a LoRA adapter (adapter_config.json)" if (directory / "adapter_config.json").is_file() else None
    if holds is None and (directory / "checkpoints").is_dir():
        holds = "a training run"
    if holds is not None:
        raise ModelError(
            f"{setting}: {name} holds {holds}, not a model to train from; merge it into a model directory first "
            f"(rayft export {name} MERGED_DIR --merge) and give {setting}=MERGED_DIR"
        )


def check_tokenizer_files(directory: Path, *, setting: str = "model.name") -> None:
    """Refuse a local model directory without tokenizer files, before transformers tries to build a
    tokenizer from nothing (its error then asks to install sentencepiece)."""
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelError(
            f"{setting}: {directory} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save the tokenizer "
            "beside the weights (tokenizer.save_pretrained(directory)) or point to a directory that has one"
        )


def read_model_config(directory: Path, *, setting: str = "model.name") -> dict[str, object]:
    """The ``config.json`` of a local model directory; refused when missing, empty or not a JSON object."""
    path = directory / "config.json"
    if not path.is_file():
        raise ModelError(
            f"{setting}: {directory} has no config.json, so it is not a model directory; give the directory "
            "save_pretrained wrote, a .gguf file, a Hub id or a built-in name"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelError(
            f"{setting}: {path} is not valid JSON ({exc}); it must hold the model's config as save_pretrained "
            "writes it: restore it from the model's source"
        ) from None
    if not isinstance(config, dict):
        raise ModelError(
            f"{setting}: {path} holds a JSON {type(config).__name__}, not a model config (an object); restore it "
            "from the model's source"
        )
    return config


def did_you_mean(name: str, known: list[str]) -> str:
    """`` Did you mean 'x'?`` for the closest known name (case aside), or an empty string."""
    lowered = {k.lower(): k for k in known}
    guesses = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f" Did you mean {lowered[guesses[0]]!r}?" if guesses else ""


def hub_cache_dir() -> Path:
    """The Hugging Face cache of Hub models, as huggingface_hub computes it from the environment."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cached_hub_models() -> list[str]:
    """The Hub ids whose files the local cache holds."""
    return sorted(p.name.removeprefix("models--").replace("--", "/") for p in hub_cache_dir().glob("models--*"))


def hub_unavailable_reason() -> str | None:
    """Why the Hub cannot be used from here (None: it answers)."""
    for variable in _OFFLINE_VARIABLES:
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"the Hub is switched off ({variable}={os.environ[variable]})"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not answers(parts.hostname or "", port):
        return f"the Hub ({endpoint}) does not answer within {PROBE_TIMEOUT_S:g} s"
    return None


@functools.cache
def answers(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection within :data:`PROBE_TIMEOUT_S` (name lookup
    included, which has no timeout of its own: it runs in a thread that is left behind)."""
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="rayft-hub-probe", daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S)
    return bool(result and result[0])
