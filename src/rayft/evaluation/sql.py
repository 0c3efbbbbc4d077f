"""Text-to-SQL scoring by execution: run the predicted and the reference query on the example's table.

Each example's table (JSON: ``name``, ``header``, ``types``, ``rows``) is loaded into an in-memory
SQLite database. The predicted query runs read-only (an authorizer allows reading and functions
only: no writes, ATTACH or PRAGMA), within an instruction budget and a wall-clock limit checked by
SQLite's progress handler, with SQLite's own limits on a value's size (``zeroblob(999999999)`` fails
at once) and the query's length, and a cap on the result's bytes. The progress handler does not run
inside one function call (a ``LIKE`` with many ``%`` on a long text can take minutes), so
:func:`score_execution` runs the whole comparison in :mod:`rayft.sandbox`'s child process, killed
at its wall-clock, memory and output limits: a pathological query fails instead of hanging. It is correct when
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
from pathlib import Path
from typing import Any

from rayft.errors import DataError
from rayft.sandbox import Limits, run_python

MAX_INSTRUCTIONS = 20_000_000
"""SQLite virtual-machine instructions one query may run (a full scan of a small table is ~100s)."""
TIMEOUT_S = 2.0
"""Wall-clock limit of one query."""
MAX_ROWS = 10_000
"""Result rows read; a longer result is compared on its first rows (and counted as long)."""
MAX_QUERY_CHARS = 10_000
"""The longest query run (SQLite's SQL length limit too); a longer completion is an invalid query."""
MAX_VALUE_BYTES = 1_000_000
"""The largest text or blob one value may hold (SQLite's length limit): tables here are small."""
MAX_RESULT_BYTES = 16_000_000
"""The bytes a result may hold, summed over its values; a larger one is an error, not a result."""
SANDBOX_WALL_S = 10.0
"""The hard limit of one comparison's process: two queries of ``TIMEOUT_S`` each, the interpreter's start,
and room for a loaded machine. It kills what SQLite's own checks miss (they do not run inside one call)."""
BATCH = 64
"""Queries compared in one sandboxed process by :func:`score_many`."""
SANDBOX_MEMORY_MB = 512
"""Memory of the process that runs one comparison (the interpreter, SQLite, two results)."""
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
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1000)
    return conn


def execute(conn: sqlite3.Connection, query: str) -> Outcome:
    """Run one query within the budget; every failure comes back as ``Outcome.error``."""
    if not query.strip():
        return Outcome(error="empty query")
    if len(query) > MAX_QUERY_CHARS:
        return Outcome(error=f"the query is {len(query)} characters, over the limit of {MAX_QUERY_CHARS}")
    deadline = time.monotonic() + TIMEOUT_S
    steps = [0]

    def progress() -> int:
        steps[0] += _CHECK_EVERY
        return int(steps[0] > MAX_INSTRUCTIONS or time.monotonic() > deadline)

    conn.set_progress_handler(progress, _CHECK_EVERY)
    try:
        return _fetch(conn.execute(query))
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
        reason = "over the time or step limit" if "interrupted" in str(exc) else str(exc)
        return Outcome(error=f"{type(exc).__name__}: {reason}")
    finally:
        conn.set_progress_handler(None, 0)


def _fetch(cursor: sqlite3.Cursor) -> Outcome:
    """Up to ``MAX_ROWS`` rows, read in chunks so that a result past ``MAX_RESULT_BYTES`` stops early."""
    rows: list[Row] = []
    size = 0
    while len(rows) < MAX_ROWS:
        chunk = cursor.fetchmany(min(256, MAX_ROWS - len(rows)))
        if not chunk:
            break
        rows.extend(tuple(r) for r in chunk)
        size += sum(len(v) if isinstance(v, str | bytes) else 8 for r in chunk for v in r)
        if size > MAX_RESULT_BYTES:
            return Outcome(error=f"the result holds over {MAX_RESULT_BYTES} bytes; a query's result must be smaller")
    return Outcome(tuple(rows))


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
    """(correct, predicted outcome) of one predicted query against the reference on ``table``, compared
    in a sandboxed process (its outcome's rows: the first few, for display). A table that does not
    parse or a reference that does not run raises :class:`DataError`."""
    (result,) = score_many([(predicted, reference, table, where)])
    if isinstance(result, DataError):
        raise result
    return result


def score_many(items: Sequence[tuple[str, str, str, str]]) -> list[tuple[bool, Outcome] | DataError]:
    """:func:`score_execution` of many (predicted, reference, table, where), in one sandboxed process: one
    process start instead of one per query (~0.1-0.2 s each). Each query keeps its own step and time
    budget; when the process as a whole is stopped (a query SQLite's checks miss), each is scored again
    in a process of its own, so that only the culprit fails. A bad table or reference is its item's
    :class:`DataError`."""
    jobs: list[Job] = [(p, r, t, w, 5) for p, r, t, w in items]
    answers = [a for start in range(0, len(jobs), BATCH) for a in _in_sandbox(jobs[start : start + BATCH])]
    return [DataError(a["data_error"]) if "data_error" in a else (bool(a.get("correct")), _outcome(a)) for a in answers]


def run_query(query: str, table: str, where: str, show: int = 20) -> Outcome:
    """One query's first ``show`` rows on ``table``, run read-only in a sandboxed process (the SQL tool
    of the environments); every failure comes back as ``Outcome.error``."""
    (answer,) = _in_sandbox([(query, None, table, where, show)])
    if "data_error" in answer:
        raise DataError(answer["data_error"])
    return _outcome(answer)


def _outcome(answer: dict[str, Any]) -> Outcome:
    return Outcome(tuple(tuple(r) for r in answer.get("rows", ())), answer.get("error"))


Job = tuple[str, str | None, str, str, int]
"""(predicted, reference or None, table, where, rows to show)."""


def _in_sandbox(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """The answers of :func:`compare_in_process` for ``jobs``: checked here when no query is needed (a
    table that does not parse, an empty or overlong query), the rest computed in one sandboxed process."""
    answers: list[dict[str, Any] | None] = [
        _answer_here(predicted, table, where) for predicted, _, table, where, _ in jobs
    ]
    pending = [i for i, answer in enumerate(answers) if answer is None]
    computed = _run_jobs([jobs[i] for i in pending]) if pending else []
    if len(pending) > 1 and computed[0].get("stopped"):  # one query stopped them all: find it, one at a time
        computed = [_run_jobs([jobs[i]])[0] for i in pending]
    for i, answer in zip(pending, computed, strict=True):
        answers[i] = answer
    return [a for a in answers if a is not None]


def _answer_here(predicted: str, table: str, where: str) -> dict[str, Any] | None:
    try:
        parse_table(table, where)
    except (DataError, ValueError) as exc:  # ValueError: text that is not JSON
        return {
            "data_error": f"{where}: the table does not parse ({exc})" if not isinstance(exc, DataError) else str(exc)
        }
    if not predicted.strip() or len(predicted) > MAX_QUERY_CHARS:
        with closing(sqlite3.connect(":memory:")) as empty:  # the length check, without a process
            return {"correct": False, "error": execute(empty, predicted).error}
    return None


def batch_wall_s(queries: int) -> float:
    """The wall-clock limit of a process comparing ``queries`` queries: each pair (predicted, reference)
    has its own ``TIMEOUT_S`` budget inside."""
    return SANDBOX_WALL_S + 2 * TIMEOUT_S * (queries - 1)


def _run_jobs(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """Run ``jobs`` in one sandboxed process; each answer, or, when the process was stopped, the same
    error for each (marked ``stopped``)."""
    budget = {"MAX_INSTRUCTIONS": MAX_INSTRUCTIONS, "TIMEOUT_S": TIMEOUT_S, "MAX_ROWS": MAX_ROWS}
    wall = batch_wall_s(len(jobs))
    limits = Limits(wall_s=wall, cpu_s=wall, memory_mb=SANDBOX_MEMORY_MB, processes=4,
                    output_bytes=1_000_000 * len(jobs), file_mb=1)  # fmt: skip
    stdin = json.dumps({"budget": budget, "jobs": jobs})
    run = run_python(_RUNNER, stdin=stdin, limits=limits, site_packages=False, paths=(_SOURCE_ROOT,))
    lines = run.stdout.strip().split("\n")
    if run.error is not None or len(lines) != len(jobs):
        reason = run.error or "the query process ended early"
        return [{"correct": False, "error": f"the query was stopped: {reason}", "stopped": True} for _ in jobs]
    return [json.loads(line) for line in lines]


def compare_in_process(predicted: str, reference: str | None, table: str, where: str, show: int) -> dict[str, Any]:
    """The work :func:`score_execution` and :func:`run_query` do in their sandbox, as JSON-ready values:
    the predicted query's first ``show`` rows, its error, and whether it gives the reference's result."""
    try:
        correct, got = _compare(predicted, reference, table, where)
    except DataError as exc:
        return {"data_error": str(exc)}
    shown = [[v if isinstance(v, int | float | str) or v is None else repr(v) for v in r] for r in got.rows[:show]]
    return {"correct": correct, "error": got.error, "rows": shown}


def _compare(predicted: str, reference: str | None, table: str, where: str) -> tuple[bool, Outcome]:
    with closing(connect(parse_table(table, where))) as conn:
        expected = reference_outcome(conn, reference, where) if reference is not None else None
        got = execute(conn, predicted)
    if got.error is not None or expected is None:
        return False, got
    return same_result(got.rows, expected.rows, ordered=is_ordered(reference or "")), got


_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the rayft package
_RUNNER = """
import json, sys
from rayft.evaluation import sql
job = json.load(sys.stdin)
for name, value in job["budget"].items():
    setattr(sql, name, value)
for predicted, reference, table, where, show in job["jobs"]:
    print(json.dumps(sql.compare_in_process(predicted, reference, table, where, show)), flush=True)
"""
