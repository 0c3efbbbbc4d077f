"""``runs/`` owns where a run lives: the rest of the code asks a store, and does not branch on it.

Counted with ``ast`` over ``src/rayft``: a condition (``if``, ``while``, a conditional expression,
``and``/``or``, a comprehension filter, ``match``) that names ``remote_uri``, ``is_remote`` or
``RemoteRun`` outside ``runs/`` is a branch on local-or-remote that a store method should answer.
The few that remain have a comment saying why no store can answer them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rayft
from rayft.syntax import parse

SRC = Path(rayft.__file__).parent
REMOTE_NAMES = frozenset({"remote_uri", "is_remote", "RemoteRun"})
MOST_BRANCHES = 5


def names_remote(node: ast.AST) -> bool:
    """Whether an expression names one of :data:`REMOTE_NAMES` (as a name or an attribute)."""
    return any(
        (isinstance(n, ast.Name) and n.id in REMOTE_NAMES) or (isinstance(n, ast.Attribute) and n.attr in REMOTE_NAMES)
        for n in ast.walk(node)
    )


def conditions(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` branches on."""
    if isinstance(node, (ast.If, ast.IfExp, ast.While)):
        return [node.test]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.comprehension):
        return list(node.ifs)
    if isinstance(node, ast.Match):
        return [node.subject]
    return []


def remote_branches(tree: ast.AST) -> list[int]:
    """The lines of the conditions in ``tree`` that name local-or-remote."""
    return sorted({c.lineno for n in ast.walk(tree) for c in conditions(n) if names_remote(c)})


def outside_runs() -> dict[str, ast.Module]:
    """Every module of rayft outside ``runs/``, parsed, by its path under ``src/rayft``."""
    files = (p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] != "runs")
    return {p.relative_to(SRC).as_posix(): parse(p.read_text(encoding="utf-8")) for p in files}


def test_the_counter_sees_each_kind_of_branch() -> None:
    source = """
if store.remote_uri is None: pass
x = a if is_remote(p) else b
y = ready and loc.remote_uri
z = [f for f in files if RemoteRun]
while not is_remote(q): pass
w = store.remote_uri
"""
    assert remote_branches(parse(source)) == [2, 3, 4, 5, 6]


def test_at_most_five_branches_on_remote_storage_remain_outside_runs() -> None:
    found = {path: lines for path, tree in outside_runs().items() if (lines := remote_branches(tree))}
    total = sum(len(lines) for lines in found.values())
    assert total <= MOST_BRANCHES, f"{total} branches on remote storage outside rayft/runs/: {found}"


def test_each_remaining_branch_says_why_no_store_answers_it() -> None:
    for path, tree in outside_runs().items():
        text = (SRC / path).read_text(encoding="utf-8").splitlines()
        for line in remote_branches(tree):
            around = " ".join(text[max(line - 2, 0) : line])
            assert "#" in around, f"rayft/{path}:{line} branches on remote storage without a comment saying why"


def test_remote_run_is_imported_only_under_runs() -> None:
    importers = sorted(
        path
        for path, tree in outside_runs().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module == "rayft.runs.remote" or any(a.name == "RemoteRun" for a in node.names))
    )
    assert importers == []


def test_no_storage_path_is_told_remote_by_hand_outside_runs() -> None:
    """``"://" in cfg.storage_path`` is :func:`rayft.runs.location.is_remote` spelt again."""

    def by_hand(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Compare)
            and any(isinstance(n, ast.Constant) and n.value == "://" for n in [node.left, *node.comparators])
            and any(isinstance(n, ast.Attribute) and n.attr == "storage_path" for n in ast.walk(node))
        )

    found = sorted(f"{path}:{n.lineno}" for path, tree in outside_runs().items() for n in ast.walk(tree) if by_hand(n))
    assert found == []
