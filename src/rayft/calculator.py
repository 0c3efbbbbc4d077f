"""The calculator tool: arithmetic on exact integers and floats, evaluated by walking Python's syntax
tree, never by ``eval``.

Python's own :func:`ast.parse` reads the expression; only numbers, ``+ - * / // % **``, unary signs,
parentheses and a few functions (``abs``, ``round``, ``min``, ``max``, ``sqrt``) are evaluated, and
anything else (a name, an attribute, a call of another function, a string) is refused with the node it
met. Integers are Python's, so ``123456789 ** 5`` is exact. Sizes are bounded so that one call stays fast:
the expression's length, its depth, and the bits of every intermediate integer (``9 ** 9 ** 9`` is
refused before it is computed).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from rayft.syntax import parse

MAX_CHARS = 2000
"""The longest expression evaluated."""
MAX_BITS = 100_000
"""The largest integer (in bits) any step may produce: about 30,000 decimal digits."""
MAX_DEPTH = 50
"""The deepest nesting of operations."""

SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly (big integers included) and return the result.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"description": "An arithmetic expression, e.g. '(3 + 4) * 2**10'", "type": "string"}
            },
            "required": ["expression"],
        },
    },
}
"""The calculator's OpenAI function schema: what the tools environment lists to the model in an episode
and what SDG's tool-use traces list, so that training shows the tool exactly as episodes do."""

Number = int | float
_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_FUNCTIONS: dict[str, Callable[..., Number]] = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is the model's answer."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (integers are exact; ``/`` divides exactly when the result is
    whole) and return the result as text."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters; at most {MAX_CHARS}")
    try:
        tree = parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    return _format(_evaluate(tree.body, 0))


def _format(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value)


def _evaluate(node: ast.expr, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node.op, _evaluate(node.left, depth + 1), _evaluate(node.right, depth + 1))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
        args = [_evaluate(arg, depth + 1) for arg in node.args]
        try:
            return _checked(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError) as exc:
            raise CalculatorError(f"{node.func.id}(): {exc}") from None
    raise CalculatorError(
        f"unsupported {type(node).__name__} {ast.unparse(node)[:40]!r}; use numbers, + - * / // % ** and "
        f"{', '.join(_FUNCTIONS)}"
    )


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):
        _check_power(left, right)
    if isinstance(op, ast.Div) and isinstance(left, int) and isinstance(right, int) and right != 0:
        exact = Fraction(left, right)  # exact for big integers, where float division would round
        return int(exact) if exact.denominator == 1 else left / right
    try:
        return _checked(_BINARY[type(op)](left, right))
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result overflows a float; use integers for large numbers") from None


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power whose integer result would pass ``MAX_BITS`` before computing it."""
    big = isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1
    if big and exponent * abs(int(base)).bit_length() > MAX_BITS:
        raise CalculatorError(f"the result would have over {MAX_BITS} bits; the calculator stops there")
    if isinstance(exponent, int) and exponent < 0 and base == 0:
        raise CalculatorError("zero to a negative power")


def _checked(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"the result has over {MAX_BITS} bits; the calculator stops there")
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    return value
