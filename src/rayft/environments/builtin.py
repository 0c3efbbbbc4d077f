"""The tools rayft ships: a calculator, SQL on the row's own table, and Python in the process sandbox.

The SQL tool runs in the read-only sandbox of the ``sql`` reward (:func:`rayft.evaluation.sql.run_query`),
the Python tool in :mod:`rayft.sandbox` (time, memory, processes, output; no network; no writes outside
its scratch directory). A failure is the tool's answer: the text the model reads.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field

from rayft.calculator import SCHEMA, calculate
from rayft.environments.tools import Row, Tool, tool_from_function
from rayft.evaluation import sql
from rayft.sandbox import Limits, run_python


def calculator_tool() -> Tool:
    """The calculator: exact integer arithmetic and floats, ``+ - * / // % **``, abs, round, min, max, sqrt."""

    def calculator(expression: str) -> str:
        return calculate(expression)

    # The schema is the calculator module's, which SDG's tool-use traces list too.
    function = SCHEMA["function"]
    return tool_from_function(calculator, description=function["description"], parameters=function["parameters"])


def sql_tool(table_column: str = "table") -> Tool:
    """SQL on the episode row's table in ``table_column`` (JSON: name, header, types, rows), read-only."""

    def sql_query(query: Annotated[str, Field(description="One SQLite SELECT statement")], row: Row) -> str:
        """Run a read-only SQL query on this problem's table and return its first rows."""
        if table_column not in row:
            raise ValueError(f"this problem has no table (no {table_column!r} column in its row)")
        table = row[table_column]
        text = table if isinstance(table, str) else json.dumps(table, default=str)
        outcome = sql.run_query(query, text, f"the row's {table_column!r} column")
        if outcome.error is not None:
            raise ValueError(outcome.error)
        return "\n".join(json.dumps(list(r), default=str) for r in outcome.rows) or "(no rows)"

    return tool_from_function(sql_query)


def python_tool(limits: Limits | None = None) -> Tool:
    """Python run in the process sandbox; the answer is its output (stdout, then stderr)."""
    bounds = limits or Limits(wall_s=10.0, cpu_s=10.0, memory_mb=512, processes=16, output_bytes=16384)

    def python(code: Annotated[str, Field(description="A Python program; print what you want to read")]) -> str:
        """Run a Python program in a sandbox (no network, no files kept) and return what it printed."""
        result = run_python(code, limits=bounds)
        if result.status == "timeout":
            raise TimeoutError(result.error)
        output = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr.strip() else "")
        if result.error is not None:
            raise RuntimeError(f"{result.error}\n{output}".strip())
        return output or "(no output)"

    return tool_from_function(python)


BUILTIN_TOOLS: dict[str, Any] = {"calculator": calculator_tool, "sql": sql_tool, "python": python_tool}
"""The shipped tools by name (``train.rl.environment.tools``), each a builder of its :class:`Tool`."""
