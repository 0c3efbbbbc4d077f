"""``rayft config``: show the resolved config, validate it, and list every field with its help.

It reads the config package alone, not :mod:`rayft.api`: it runs nothing.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import click
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rayft.cli.common import config_argument, load_cli_config, overrides_argument
from rayft.config import RayftConfig, dump_config
from rayft.config.checks import CHECKS, check_config
from rayft.errors import ConfigError


@click.group()
def config() -> None:
    """Inspect configs: the resolved values, validation, and the documentation of every field."""


@config.command()
@config_argument
@overrides_argument
def show(config_path: str, overrides: tuple[str, ...]) -> None:
    """Print the resolved config (defaults < CONFIG < overrides) as YAML."""
    click.echo(dump_config(load_cli_config(config_path, overrides)), nl=False)


@config.command()
@config_argument
@overrides_argument
@click.option(
    "--command",
    type=click.Choice(sorted({c for check in CHECKS for c in check.commands})),
    help="Also make the checks that only this command needs (run: the config names a pipeline stage).",
)
def validate(config_path: str, overrides: tuple[str, ...], command: str | None) -> None:
    """Check a config and report every problem at once: its schema, and every check a command makes of
    the whole config before it starts (the same checks, from one table)."""
    check_config(load_cli_config(config_path, overrides), command)
    click.echo(f"{config_path}: valid")


@config.command()
@click.argument("prefix", required=False, default="")
def fields(prefix: str) -> None:
    """List every config field (optionally those under PREFIX, e.g. 'train') with its help."""
    rows = [row for row in iter_fields(RayftConfig) if row[0].startswith(prefix)]
    if not rows:
        raise ConfigError(_no_fields_message(prefix))
    for path, annotation, default, description in rows:
        click.echo(f"{path}: {annotation} = {default}")
        click.echo(f"    {description}")


def _no_fields_message(prefix: str) -> str:
    """Why ``rayft config fields PREFIX`` lists nothing, and what to type instead."""
    if Path(prefix).is_file() or prefix.endswith((".yaml", ".yml")):
        return (
            f"rayft config fields: {prefix!r} is a file, but the argument is a field prefix such as 'train' or "
            f"'k8s'; `rayft config fields` lists every field, `rayft config show {prefix}` a config's values"
        )
    sections = sorted({path.split(".", 1)[0] for path, *_ in iter_fields(RayftConfig)})
    guess = difflib.get_close_matches(prefix.split(".", 1)[0], sections, n=1)
    hint = f" Did you mean {guess[0]!r}?" if guess else ""
    return f"rayft config fields: no field starts with {prefix!r}.{hint} Sections: {', '.join(sections)}"


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """Walk a config model depth-first: (dotted path, type, default, description) per leaf field."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _nested_model(info.annotation)
        if nested is not None:
            yield from iter_fields(nested, f"{path}.")
            continue
        default = _default_text(info)
        yield path, _type_text(info.annotation), default, info.description or ""


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _nested_model(members[0])
    return None


def _default_text(info: Any) -> str:
    if info.default is not PydanticUndefined:
        return repr(info.default)
    if info.default_factory is not None:
        value = info.default_factory()
        return repr(value.model_dump() if isinstance(value, BaseModel) else value)
    return "(required)"


def _type_text(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")
