"""Python's :func:`ast.parse`, safe against a CPython race that rayft's threads can hit.

Some CPython releases, 3.11.7 among them, keep the AST converter's recursion depth in state shared by
the whole interpreter (python/cpython#106905; later releases keep it per parse). A parse that starts while
another one is converting its tree (a tool call on an episode thread, or one run by a finalizer that the
garbage collector calls in the middle of a conversion) leaves the counter off, and the first one fails
with ``SystemError: AST constructor recursion depth mismatch`` although its source is valid. Every parse
resets the counter, so parsing again gives the right tree.
"""

from __future__ import annotations

import ast
from typing import Literal, overload

_RACE = "AST constructor recursion depth mismatch"
_TRIES = 5


@overload
def parse(source: str, mode: Literal["exec"] = "exec", filename: str = "<unknown>") -> ast.Module: ...
@overload
def parse(source: str, mode: Literal["eval"], filename: str = "<unknown>") -> ast.Expression: ...
def parse(
    source: str, mode: Literal["exec", "eval"] = "exec", filename: str = "<unknown>"
) -> ast.Module | ast.Expression:
    """The syntax tree of ``source``, as :func:`ast.parse` gives it; a :class:`SyntaxError` as it raises.

    Parses again (up to five times) when the interpreter's converter hit the race above.
    """
    for attempt in range(_TRIES):
        try:
            tree = ast.parse(source, filename=filename, mode=mode)
            assert isinstance(tree, (ast.Module, ast.Expression))  # what these two modes give
            return tree
        except SystemError as exc:
            if _RACE not in str(exc) or attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
