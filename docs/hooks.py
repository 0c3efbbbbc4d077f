"""mkdocs hook: the configuration and CLI references, generated from the code at every build, and
the example notebooks as pages.

Nothing generated is committed: the pages are built from ``rayft.config.RayftConfig`` and the click
group ``rayft.cli.main.cli`` each time, so they cannot drift from what rayft accepts. The notebooks
of ``examples/notebooks/`` are added as they are in the repository (outputs stripped), and the
mkdocs-jupyter plugin renders them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

from rayft.cli.config_cmd import iter_fields
from rayft.cli.main import cli
from rayft.config.schema import RayftConfig


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Every field of a rayft config, generated from its pydantic models. Set one in the YAML file or "
        "as a dotted override after it: `rayft train CONFIG train.learning_rate=1e-4`.",
        "",
    ]
    section = None
    for path, annotation, default, description in iter_fields(RayftConfig):
        top = path.split(".")[0] if "." in path else "(top level)"
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| field | type | default | description |", "|---|---|---|---|"]
        lines.append(f"| `{path}` | `{_cell(annotation)}` | `{_cell(default)}` | {_cell(description)} |")
    return "\n".join(lines) + "\n"


def _command_lines(cmd: click.Command, path: str, ctx: click.Context) -> list[str]:
    lines = [f"## `{path}`", "", cmd.help or "", "", "```text", cmd.get_usage(ctx), "```", ""]
    params = [p for p in cmd.get_params(ctx) if p.get_help_record(ctx)]
    if params:
        lines += ["| option | help |", "|---|---|"]
        for param in params:
            record = param.get_help_record(ctx)
            assert record is not None
            lines.append(f"| `{_cell(record[0])}` | {_cell(record[1])} |")
        lines.append("")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += _command_lines(sub, f"{path} {name}", click.Context(sub, info_name=name, parent=ctx))
    return lines


def cli_reference() -> str:
    ctx = click.Context(cli, info_name="rayft")
    head = ["# Command reference", "", "Every `rayft` command with its help and options, generated from the CLI.", ""]
    return "\n".join(head + _command_lines(cli, "rayft", ctx)) + "\n"


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def notebook_files(config: Any) -> list[File]:
    """Every notebook of ``examples/notebooks/``, as the site page ``notebooks/<name>/``."""
    return [
        File(f"notebooks/{path.name}", str(EXAMPLES), config["site_dir"], config["use_directory_urls"])
        for path in sorted((EXAMPLES / "notebooks").glob("*.ipynb"))
    ]


# A link from one notebook to another, as Jupyter follows it: a sibling file name.
_SIBLING_NOTEBOOK = re.compile(r'href="([\w-]+)\.ipynb(#[^"]*)?"')


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Point a notebook's links to its sibling notebooks at their pages (``../<name>/``): mkdocs
    rewrites the links of Markdown pages, not those inside a rendered notebook."""
    if not page.file.src_uri.startswith("notebooks/") or not page.file.src_uri.endswith(".ipynb"):
        return html
    return _SIBLING_NOTEBOOK.sub(lambda m: f'href="../{m.group(1)}/{m.group(2) or ""}"', html)


# Before the mkdocs-jupyter plugin's own on_files, which turns the .ipynb files it sees into pages.
@event_priority(100)
def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/config.md", content=config_reference()))
    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    for notebook in notebook_files(config):
        files.append(notebook)
    return files
