"""Count the annotations that are a bare ``Any`` in a package, and say where each is.

    .venv/bin/python scripts/count_any.py                       # src/rayft/training
    .venv/bin/python scripts/count_any.py src/rayft/serving --max 10

An annotation counts when it is exactly ``Any`` (the name, ``typing.Any``, or the string ``"Any"``):
a parameter's (``*args`` and ``**kwargs`` included), a return's, or a variable's or attribute's.
``dict[str, Any]``, ``Any | None`` and the like are not counted: they still say what the outer value is.
Prints one line per annotation (path:line, what is annotated, the source line) and the count last.
With ``--max N`` the exit status is 1 when more than N are found, so a check can hold the line.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / "src" / "rayft" / "training"


def is_bare_any(annotation: ast.expr | None) -> bool:
    """Whether an annotation is exactly ``Any`` (``Any``, ``typing.Any``, ``t.Any`` or ``"Any"``)."""
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value.strip() in ("Any", "typing.Any")
    return False


def _function_annotations(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[int, str]]:
    args = node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    params += [a for a in (args.vararg, args.kwarg) if a is not None]
    for param in params:
        if is_bare_any(param.annotation):
            yield param.lineno, f"parameter {param.arg!r} of {node.name}()"
    if is_bare_any(node.returns):
        yield node.lineno, f"return of {node.name}()"


def bare_anys(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for every bare ``Any`` annotation in a parsed module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _function_annotations(node)
        elif isinstance(node, ast.AnnAssign) and is_bare_any(node.annotation):
            yield node.lineno, f"variable {ast.unparse(node.target)}"


def scan(root: Path) -> list[tuple[Path, int, str, str]]:
    """Every bare ``Any`` under a directory (or in one file), in path and line order."""
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for line, what in sorted(bare_anys(ast.parse(source, filename=str(path)))):
            found.append((path, line, what, lines[line - 1].strip()))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT, help="a package directory or a file")
    parser.add_argument("--max", type=int, default=None, help="exit 1 when more than this many are found")
    args = parser.parse_args(argv)
    if not args.root.exists():
        print(f"count_any: {args.root} does not exist; give a package directory or a .py file", file=sys.stderr)
        return 2
    found = scan(args.root)
    for path, line, what, text in found:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"{shown}:{line}: {what}: {text}")
    print(f"{len(found)} bare Any annotation(s) under {args.root}")
    return 1 if args.max is not None and len(found) > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
