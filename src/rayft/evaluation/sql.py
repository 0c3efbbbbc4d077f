"""Text-to-SQL scoring by execution: run the predicted and the reference query on the example's table.

Each example's table (JSON: ``name``, ``header``, ``types``, ``rows``) is loaded into an in-memory
SQLite database. The predicted query runs read-only (an authorizer allows reading and functions
only: no writes, ATTACH or PRAGMA), within an instruction budget and a wall-clock limit checked by
SQLite's progress handler, so a pathological query fails instead of hanging. It is correct when
its result equals the reference query's result: as a multiset of rows, or as a sequence when the
reference has ``ORDER BY``; numbers compare with a tolerance, so ``3`` equals ``3.0``.

Per example: ``execution_accuracy`` (1 when the results agree), ``exact_match`` (the normalised
texts agree, see :func:`rayft.evaluation.metrics.normalize_sql`) and ``invalid_sql_rate`` (1 when
the predicted query does not run: a syntax error, an unknown column, a refused statement, a timeout).
Examples without a table are scored by exact match only.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from rayft.errors import DataError

MAX_INSTRUCTIONS = 20_000_000
"""SQLite virtual-machine instructions one query may run (a full scan of a small table is ~100s)."""
TIMEOUT_S = 2.0
"""Wall-clock limit of one query."""
MAX_ROWS = 10_000
"""Result rows read; a longer result is compared on its first rows (and counted as long)."""
REL_TOL = 1e-6
ABS_TOL = 1e-6
_CHECK_EVERY = 1000  # instructions between progress-handler calls
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_TYPES = {"text": "TEXT", "integer": "INTEGER", "real": "REAL", "number": "REAL"}
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}

Row = tuple[Any, ...]


@dataclass(frozen=True)
class TableSpec:
    """One example's table: its name, columns, their SQL types and the rows."""

    name: str
    header: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Outcome:
    """A query's result rows, or the error that stopped it."""

    rows: tuple[Row, ...] = ()
    error: str | None = None


def parse_table(value: str | Mapping[str, Any], where: str = "table") -> TableSpec:
    """A table from its JSON text or mapping: ``header`` (or ``columns``), ``rows``, optional
    ``types`` (text/integer/real; default text) and ``name`` (default ``table``)."""
    data = json.loads(value) if isinstance(value, str) else dict(value)
    if not isinstance(data, dict):
        raise DataError(f"{where}: a table must be a JSON object with header and rows, not {type(data).__name__}")
    header = data.get("header", data.get("columns"))
    rows = data.get("rows")
    if not isinstance(header, list) or not header or not isinstance(rows, list):
        raise DataError(f"{where}: a table needs a non-empty 'header' list and a 'rows' list (keys: {sorted(data)})")
    types = data.get("types") or ["text"] * len(header)
    bad = [t for t in types if str(t).lower() not in _TYPES]
    if len(types) != len(header) or bad:
        raise DataError(
            f"{where}: 'types' must give one of {sorted(_TYPES)} per column ({len(header)} columns); got {types}"
        )
    widths = {len(r) for r in rows if isinstance(r, list)}
    if any(not isinstance(r, list) for r in rows) or widths - {len(header)}:
        raise DataError(f"{where}: every row must be a list of {len(header)} values (row widths: {sorted(widths)})")
    return TableSpec(str(data.get("name") or "table"), tuple(map(str, header)), tuple(map(str, types)),
                     tuple(tuple(r) for r in rows))  # fmt: skip


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def connect(table: TableSpec) -> sqlite3.Connection:
    """An in-memory database holding ``table``, then locked to reading."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    columns = ", ".join(f"{_quote(h)} {_TYPES[t.lower()]}" for h, t in zip(table.header, table.types, strict=True))
    conn.execute(f"CREATE TABLE {_quote(table.name)} ({columns})")
    marks = ", ".join("?" * len(table.header))
    conn.executemany(f"INSERT INTO {_quote(table.name)} VALUES ({marks})", table.rows)
    conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
    return conn


def execute(conn: sqlite3.Connection, query: str) -> Outcome:
    """Run one query within the budget; every failure comes back as ``Outcome.error``."""
    if not query.strip():
        return Outcome(error="empty query")
    deadline = time.monotonic() + TIMEOUT_S
    steps = [0]

    def progress() -> int:
        steps[0] += _CHECK_EVERY
        return int(steps[0] > MAX_INSTRUCTIONS or time.monotonic() > deadline)

    conn.set_progress_handler(progress, _CHECK_EVERY)
    try:
        cursor = conn.execute(query)
        rows = tuple(tuple(r) for r in cursor.fetchmany(MAX_ROWS))
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        reason = "over the time or step limit" if "interrupted" in str(exc) else str(exc)
        return Outcome(error=f"{type(exc).__name__}: {reason}")
    finally:
        conn.set_progress_handler(None, 0)
    return Outcome(rows)


def _key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, round(float(value), 6))
    if isinstance(value, bytes):
        return (3, value)
    return (2, str(value))


def _same_value(a: Any, b: Any) -> bool:
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    if numbers:
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


def same_result(predicted: Sequence[Row], reference: Sequence[Row], *, ordered: bool) -> bool:
    """Whether two results hold the same rows (in the same order when ``ordered``)."""
    if len(predicted) != len(reference):
        return False
    if not ordered:
        predicted = sorted(predicted, key=lambda r: tuple(map(_key, r)))
        reference = sorted(reference, key=lambda r: tuple(map(_key, r)))
    return all(
        len(p) == len(r) and all(_same_value(x, y) for x, y in zip(p, r, strict=True))
        for p, r in zip(predicted, reference, strict=True)
    )


def is_ordered(query: str) -> bool:
    """Whether a query's row order is part of its result (it has ORDER BY)."""
    return bool(_ORDER_BY.search(query))


def reference_outcome(conn: sqlite3.Connection, reference: str, where: str) -> Outcome:
    """The reference query's result; a reference that does not run is a data error."""
    outcome = execute(conn, reference)
    if outcome.error is not None:
        raise DataError(
            f"{where}: the reference query {reference!r} does not run on its table ({outcome.error}); fix the "
            "dataset's output or table column"
        )
    return outcome


def check_references(references: Sequence[str], tables: Sequence[str | None], ids: Sequence[str]) -> None:
    """Fail before any generation when a table is malformed or a reference query does not run on it."""
    for reference, table, where in zip(references, tables, ids, strict=True):
        if table is not None:
            with closing(connect(parse_table(table, where))) as conn:
                reference_outcome(conn, reference, where)


def score_execution(predicted: str, reference: str, table: str, where: str) -> tuple[bool, Outcome]:
    """(correct, predicted outcome) of one predicted query against the reference on ``table``."""
    with closing(connect(parse_table(table, where))) as conn:
        expected = reference_outcome(conn, reference, where)
        got = execute(conn, predicted)
    if got.error is not None:
        return False, got
    return same_result(got.rows, expected.rows, ordered=is_ordered(reference)), got
