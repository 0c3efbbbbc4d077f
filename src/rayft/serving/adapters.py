"""LoRA adapters loaded and unloaded while ``rayft serve`` runs (``POST /v1/load_lora_adapter``, vLLM's route).

The router keeps which adapters were loaded at run time, in the order they were last used
(:class:`RuntimeAdapters`): loading one more than ``serve.max_runtime_adapters`` unloads the least recently
used of them; the adapters given at start are never unloaded. A replica makes the adapter's files local
(:func:`local_adapter_dir`: a directory as it is, a URI through rayft's storage layer into the cache) and
checks them (:func:`check_adapter_dir`) before PEFT loads them; whatever does not fit is a 400 in OpenAI's
error shape with one line saying what and how to fix it, never a 500.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.serving.protocol import RequestError

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
"""The files PEFT saves an adapter's weights in."""


@dataclass(frozen=True)
class LoadRequest:
    """The body of ``POST /v1/load_lora_adapter``: the adapter's served name, its directory or URI, and the base
    model it goes on (needed when the server serves several bases)."""

    lora_name: str
    lora_path: str
    base_model_name: str | None = None


def _body(raw: bytes, route: str) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise RequestError(400, f'{route} takes a JSON object, e.g. {{"lora_name": "x", "lora_path": "/dir"}}')
    return body


def _text(body: dict[str, Any], key: str, route: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RequestError(400, f"{route}: {key} must be a non-empty string; got {json.dumps(value)}", key)
    return value.strip()


def parse_load(raw: bytes) -> LoadRequest:
    """The load request of a body; a 400 naming the field that is missing, of the wrong type or unknown."""
    route = "/v1/load_lora_adapter"
    body = _body(raw, route)
    if unknown := sorted(set(body) - {"lora_name", "lora_path", "base_model_name"}):
        raise RequestError(400, f"{route}: unknown field {unknown[0]!r}; it takes lora_name, lora_path and "
                           "base_model_name", unknown[0])  # fmt: skip
    name, path = _text(body, "lora_name", route), _text(body, "lora_path", route)
    assert name is not None and path is not None
    return LoadRequest(name, path, _text(body, "base_model_name", route, required=False))


def parse_unload(raw: bytes) -> str:
    """The adapter name of a ``POST /v1/unload_lora_adapter`` body."""
    route = "/v1/unload_lora_adapter"
    name = _text(_body(raw, route), "lora_name", route)
    assert name is not None
    return name


class RuntimeAdapters:
    """The adapters loaded at run time, least recently used first, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._order: OrderedDict[str, str] = OrderedDict()  # name -> source

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def source(self, name: str) -> str | None:
        """Where a runtime adapter is loaded from (None: not one)."""
        return self._order.get(name)

    def add(self, name: str, source: str) -> list[str]:
        """Record an adapter as the most recently used; the names unloaded to stay within the limit."""
        self._order[name] = source
        self._order.move_to_end(name)
        evicted = []
        while len(self._order) > self.limit:
            evicted.append(self._order.popitem(last=False)[0])
        return evicted

    def touch(self, name: str) -> None:
        """A request used the adapter: it becomes the most recently used."""
        if name in self._order:
            self._order.move_to_end(name)

    def remove(self, name: str) -> None:
        """Forget an adapter that was unloaded."""
        self._order.pop(name, None)


def is_uri(source: str) -> bool:
    """Whether a source names remote storage (``s3://``, ``gs://``, ``file://``...) rather than a directory."""
    return "://" in source


def local_adapter_dir(source: str, cache: Path) -> Path:
    """The local directory of an adapter: ``source`` itself, or its files downloaded from a URI into ``cache``
    (once per URI) through rayft's storage layer; a 400 when the URI cannot be read or holds no files."""
    if not is_uri(source):
        return Path(source).expanduser()
    from rayft.errors import StorageError
    from rayft.runs.store import download_dir_once
    from rayft.security import mask_uri

    target = cache / hashlib.sha256(source.encode()).hexdigest()[:24]
    if (target / "adapter_config.json").is_file():
        return target
    try:
        found = download_dir_once(source, target)
    except (StorageError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RequestError(400, f"lora_path {mask_uri(source)} cannot be read: {mask_uri(reason)}; check the URI "
                           "and the storage credentials", "lora_path") from None  # fmt: skip
    if not found:
        raise RequestError(400, f"lora_path {mask_uri(source)} holds no files; give the URI of an adapter "
                           "directory (adapter_config.json and its weights)", "lora_path")  # fmt: skip
    return target


def check_adapter_dir(directory: Path, shown: str) -> None:
    """A 400 unless ``directory`` holds a LoRA adapter PEFT can load on a shared base (``shown``: its source,
    credentials masked, for the message)."""
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is a file, not a directory"
        raise RequestError(400, f"lora_path {shown} {what} on the server; give the directory of a saved LoRA adapter "
                           "(or its s3://, gs://, file:// URI)", "lora_path")  # fmt: skip
    config = directory / "adapter_config.json"
    try:
        settings = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RequestError(400, f"lora_path {shown} is not a LoRA adapter: no readable adapter_config.json in it; "
                           "give the directory PEFT's save_pretrained wrote (a checkpoint of a lora run)",
                           "lora_path") from None  # fmt: skip
    if not isinstance(settings, dict) or settings.get("peft_type") != "LORA":
        kind = settings.get("peft_type") if isinstance(settings, dict) else None
        raise RequestError(400, f"lora_path {shown} holds a {kind or 'non-PEFT'} adapter, not LoRA; rayft serve "
                           "loads LoRA adapters", "lora_path")  # fmt: skip
    if settings.get("init_lora_weights") in ("pissa", "olora"):
        raise RequestError(400, f"lora_path {shown} was initialised by {settings['init_lora_weights']}, which "
                           "rewrites the shared base weights; export it merged (rayft export) and serve that",
                           "lora_path")  # fmt: skip
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        files = " or ".join(WEIGHT_FILES)
        raise RequestError(400, f"lora_path {shown} has an adapter_config.json but no weights ({files}); copy the "
                           "whole adapter directory", "lora_path")  # fmt: skip


def load_failure(name: str, shown: str, base: str, exc: Exception) -> RequestError:
    """The 400 of an adapter PEFT could not load on the base: a shape (rank, width) or module mismatch."""
    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
    return RequestError(400, f"adapter {name!r} ({shown}) does not fit the base model {base}: {reason}; load an "
                        "adapter trained on this base", "lora_path", "adapter_mismatch")  # fmt: skip


def adapter_files(source: str) -> Path:
    """The checked local directory of the adapter at ``source`` (a directory or URI; see the module docstring)."""
    from rayft.cache import cache_root
    from rayft.security import mask_uri

    directory = local_adapter_dir(source, cache_root() / "served-adapters")
    check_adapter_dir(directory, mask_uri(source))
    return directory


def check_fits(model: Any, directory: Path, name: str, shown: str) -> None:
    """A 400 (:func:`load_failure`) unless every LoRA matrix of the adapter's safetensors fits a module of
    ``model`` (a transformers model, or a PEFT model over one): ``lora_A`` is ``[rank, in]``, ``lora_B``
    ``[out, rank]``. Read from the file's header before PEFT loads anything: PEFT would first wrap the base's
    modules, then fail on the first tensor, and leave the shared base half-changed."""
    weights = directory / WEIGHT_FILES[0]
    if not weights.is_file():
        return  # a .bin adapter: PEFT's own load is the check
    from safetensors import safe_open

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with safe_open(str(weights), framework="pt") as handle:
        shapes = {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    for key, shape in shapes.items():
        for part, axis, feature in ((".lora_A.weight", 1, "in_features"), (".lora_B.weight", 0, "out_features")):
            if not key.endswith(part):
                continue
            path = key.removeprefix("base_model.model.").removesuffix(part)
            module = _module(base, path)
            expected = getattr(module, feature, None) if module is not None else None
            if module is None or (expected is not None and expected != shape[axis]):
                what = "no such module" if module is None else f"{feature} {expected}"
                raise load_failure(name, shown, base.config.name_or_path,
                                   ValueError(f"{key} has shape {shape}, the base's {path} has {what}"))  # fmt: skip


def _module(model: Any, path: str) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None
