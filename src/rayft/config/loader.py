"""Loading a config: defaults < YAML file < dotted command-line overrides, validated at once.

Every problem is reported together, each with its dotted path, the bad value and a fix; unknown
keys get a "did you mean".
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from rayft.config.schema import RayftConfig
from rayft.errors import ConfigError
from rayft.files import unreadable_file
from rayft.security import mask_secret_fields, redact

# Names users bring from other tools, mapped to ours, for "did you mean".
_ALIASES = {
    "rank": "r",
    "lora_rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lr": "learning_rate",
    "min_lr": "min_learning_rate",
    "batch_size": "micro_batch_size",
    "per_device_train_batch_size": "micro_batch_size",
    "gradient_accumulation": "gradient_accumulation_steps",
    "epochs": "num_epochs",
    "num_train_epochs": "num_epochs",
    "hf_model_id": "name",
    "model_name": "name",
    "model_path": "name",
    "torch_dtype": "dtype",
    "warmup": "warmup_steps",
    "max_length": "max_seq_length",
    "seq_len": "max_seq_length",
    "dataset_name": "path",
    "dataset_config": "config_name",
    "workers": "num_workers",
}

_FLOAT_LIKE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RayftConfig:
    """Read a YAML config, apply ``key.sub=value`` overrides, and validate the result.

    Args:
        path: The YAML file; None starts from the defaults alone.
        overrides: Dotted assignments such as ``train.learning_rate=1e-4`` or ``lora.r=8``.

    Raises:
        ConfigError: listing every problem found, with its path, value and fix.
    """
    raw = read_yaml(path) if path is not None else {}
    defaults = RayftConfig().model_dump(mode="json")
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value, defaults)
    return validate_config(raw, source=str(path) if path else "defaults")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from a file, with errors that name the file and line.

    An empty file, a file that is not UTF-8 text and a key given twice in one section are refused:
    each is a mistake YAML itself would pass over silently (the last duplicate wins).
    """
    file = Path(path)
    problem = unreadable_file(file)
    if problem is not None:
        fix = "give the YAML file" if problem == "is a directory, not a file" else "check the path"
        raise ConfigError(f"Config file {str(file)!r} {problem}; {fix}.")
    try:
        text = file.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Config file {str(file)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "give a YAML config file, saved as UTF-8."
        ) from None
    except _DuplicateKeyError as exc:
        raise ConfigError(f"Config file {str(file)!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {str(file)!r} is not valid YAML: {exc}") from None
    if data is None:
        raise ConfigError(
            f"Config file {str(file)!r} is empty (line 1); write the sections to change (model:, data:, train:, ...), "
            "or leave the file out to use the defaults."
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {str(file)!r} must hold a mapping of sections (model:, data:, train:, ...), "
            f"not a {type(data).__name__}."
        )
    return data


class _DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML file names the same key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key that appears twice in one mapping (YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping of ``node``, after checking that no key repeats."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, typing.Hashable):
                continue  # a list or mapping as a key: YAML's own constructor refuses it below
            if key in seen:
                raise _DuplicateKeyError(
                    f"key {key!r} on line {line} repeats the one on line {seen[key]} (YAML would keep only the last); "
                    "keep one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w]*(\.[\w-]+)*")
"""The key of a dotted override (``train.learning_rate``, ``data.datasets.0.path``)."""


def parse_override(item: str) -> tuple[str, Any]:
    """Split ``a.b=value`` and parse the value as YAML (``1e-4`` is read as a number)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or not OVERRIDE_KEY.fullmatch(key):
        raise ConfigError(
            f"Override {item!r} is not of the form section.key=value "
            "(for example train.learning_rate=1e-4 or lora.r=8)."
        )
    if _FLOAT_LIKE.match(text.strip()):
        number = float(text)
        return key, int(number) if re.fullmatch(r"[+-]?\d+", text.strip()) else number
    try:
        return key, yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return key, text


def set_dotted(tree: dict[str, Any], key: str, value: Any, defaults: dict[str, Any] | None = None) -> None:
    """Assign ``value`` at a dotted path, indexing lists on the way.

    A section missing from ``tree`` is filled from ``defaults`` (so ``data.datasets.0.max_rows=10``
    edits the default dataset), or created empty.
    """
    parts = key.split(".")
    node: Any = tree
    default: Any = defaults
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        child = _child(node, part, where)
        default = _default_child(default, part)
        if child is None:
            child = copy.deepcopy(default) if isinstance(default, (dict, list)) else {}
            _assign(node, part, child, key)
        node = child
    _assign(node, parts[-1], value, key)


def _default_child(default: Any, part: str) -> Any:
    """The default under ``part``, or None where the defaults have none (say, a list item that the
    config file has and the defaults do not)."""
    if isinstance(default, dict):
        return default.get(part)
    if isinstance(default, list) and part.isdigit() and int(part) < len(default):
        return default[int(part)]
    return None


def _child(node: Any, part: str, where: str) -> Any:
    if node is None:
        return None
    if isinstance(node, list):
        return node[_list_index(node, part, where)]
    if isinstance(node, dict):
        return node.get(part)
    raise ConfigError(f"Override path {where!r} goes through a value that is not a section.")


def _assign(node: Any, part: str, value: Any, key: str) -> None:
    if isinstance(node, list):
        node[_list_index(node, part, key)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ConfigError(f"Override {key!r} goes through a value that is not a section.")


def _list_index(node: list[Any], part: str, where: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            f"Override path {where!r}: {part!r} is not an index of a list of {len(node)} items "
            f"(use 0..{len(node) - 1})."
        )
    return int(part)


def validate_config(raw: dict[str, Any], source: str = "config") -> RayftConfig:
    """Validate a raw mapping, turning pydantic's errors into one readable ConfigError."""
    try:
        return RayftConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [describe_error(err) for err in exc.errors()]
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"Invalid config ({source}), {len(problems)} problem(s):\n{lines}") from None


def describe_error(err: Any) -> str:
    """One line for one validation error: path, bad value, what is wrong, how to fix it."""
    loc = tuple(err["loc"])
    path = ".".join(str(p) for p in loc) or "<root>"
    kind = err["type"]
    if kind == "extra_forbidden":
        return _unknown_key(loc, path)
    field = _field_at(loc)
    hint = f" ({field.description})" if field is not None and field.description else ""
    if kind == "missing":
        return f"{path}: required but missing; add it{hint}."
    message = str(err["msg"]).removeprefix("Value error, ")
    if isinstance(err.get("input"), dict) and _model_at(loc) is not None:
        return f"{path}: {message}."
    return f"{path} = {mask_secret_fields(err.get('input'))!r}: {message}{hint}."


def _unknown_key(loc: tuple[Any, ...], path: str) -> str:
    model = _model_at(loc[:-1])
    valid = sorted(model.model_fields) if model is not None else []
    key = str(loc[-1])
    parent = ".".join(str(p) for p in loc[:-1])
    guesses = _guess_paths(key, parent, valid)
    suggestion = f" Did you mean {' or '.join(repr(g) for g in guesses)}?" if guesses else ""
    return f"{path}: unknown key.{suggestion} Valid keys here: {', '.join(valid)}."


def _guess_paths(key: str, parent: str, valid: list[str]) -> list[str]:
    """Full dotted paths the user probably meant: the key (or its alias) in this section, else the
    field of that name in any section (``lr`` at the top is ``train.learning_rate``), else a close
    spelling in this section."""
    prefix = f"{parent}." if parent else ""
    name = _ALIASES.get(key, key)
    if name in valid and name != key:
        return [f"{prefix}{name}"]
    elsewhere = [p for p in _field_paths(RayftConfig) if p.rsplit(".", 1)[-1] == name and p != f"{prefix}{key}"]
    if elsewhere:
        return elsewhere[:3]
    return [f"{prefix}{g}" for g in difflib.get_close_matches(key, valid, n=1, cutoff=0.5)]


@functools.cache
def _field_paths(model: type[BaseModel]) -> tuple[str, ...]:
    """Every dotted field path under ``model`` (items of a list of sections as ``.0.``)."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        paths.append(name)
        inner = _unwrap(field.annotation)
        element = _element_type(field.annotation) if typing.get_origin(inner) is list else None
        for sub, sep in ((inner, "."), (element, ".0.")):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                paths += [f"{name}{sep}{p}" for p in _field_paths(sub)]
    return tuple(paths)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that a location inside RayftConfig points to, if any."""
    current: Any = RayftConfig
    for part in loc:
        if isinstance(part, int):
            current = _element_type(current)
        elif isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = _unwrap(current.model_fields[part].annotation)
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _field_at(loc: tuple[Any, ...]) -> Any:
    parent = _model_at(tuple(p for p in loc[:-1]))
    if parent is None or not loc or loc[-1] not in parent.model_fields:
        return None
    return parent.model_fields[loc[-1]]


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] (and other unions with one model member) down to that model."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        return models[0] if len(models) == 1 else annotation
    return annotation


def _element_type(annotation: Any) -> Any:
    args = typing.get_args(_unwrap(annotation))
    return _unwrap(args[0]) if args else None


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML, every default spelled out, keys in schema order; credential
    values found in the environment and in URIs are masked (see :mod:`rayft.security`)."""
    return redact(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
