"""rayft.syntax.parse: the tree ast.parse gives, also when a parse runs inside another one's conversion."""

from __future__ import annotations

import ast
import gc

import pytest

from rayft.syntax import parse

SOURCE = "rows = [" + ", ".join(f"({i}, [{i}])" for i in range(3000)) + "]"


class _ParsesWhenCollected:
    """An object in a reference cycle whose finalizer parses: the garbage collector runs it in the middle of
    whatever allocates next, such as the conversion of a large syntax tree."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("1 + 2")


def test_a_parse_inside_another_parse_gives_the_whole_tree() -> None:
    gc.collect()
    for _ in range(50):
        _ParsesWhenCollected()
    tree = parse(SOURCE)
    assign = tree.body[0]
    assert isinstance(assign, ast.Assign) and isinstance(assign.value, ast.List)
    assert len(assign.value.elts) == 3000
    assert ast.dump(tree) == ast.dump(ast.parse(SOURCE))


def test_an_expression_and_a_syntax_error_come_back_as_ast_parse_gives_them() -> None:
    assert isinstance(parse("6 * 7", mode="eval").body, ast.BinOp)
    with pytest.raises(SyntaxError):
        parse("6 *", mode="eval")
