"""A built-in text-to-SQL set, generated offline from rayft's own schemas and question templates.

Each example is a small table with typed columns (text, integer, real), a question about it in
WikiSQL's style, and the query that answers it: ``SELECT col`` or an aggregate (COUNT of the key
column, MIN, MAX, SUM, AVG) with one to three ``WHERE`` conditions joined by AND (``=``, ``>``, ``<``). Conditions
are drawn from one row of the table, so every reference query returns a non-empty result.

Rows have the columns ``instruction``, ``input`` (the question and the table's schema as text),
``output`` (the SQL) and ``table``: the table itself as JSON (``name``, ``header``, ``types``,
``rows``), which execution scoring (:mod:`rayft.evaluation.sql`) loads into SQLite.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rayft.data.builtin.arithmetic import distinct_examples

INSTRUCTION = "Translate the question into a SQL query over the table."

Value = str | int | float
Draw = Callable[[random.Random], Value]


@dataclass(frozen=True)
class Column:
    """A column of a schema: its SQL name, the words a question uses for it, its type and values."""

    name: str
    words: str
    type: str  # "text", "integer" or "real"
    draw: Draw


def _pick(*values: str) -> Draw:
    return lambda rng: rng.choice(values)


def _int(low: int, high: int) -> Draw:
    return lambda rng: rng.randint(low, high)


def _real(low: float, high: float) -> Draw:
    return lambda rng: round(rng.uniform(low, high), 1)


@dataclass(frozen=True)
class Schema:
    """A table kind: its name, the noun for its rows, the key text column, then the other columns."""

    table: str
    noun: str
    key: Column
    columns: tuple[Column, ...]


_RANGED: dict[str, Callable[..., Draw]] = {"integer": _int, "real": _real}


def _column(entry: dict[str, Any]) -> Column:
    """A column from its entry in ``sql.yaml``: values to pick from, or a range to draw from."""
    kind = entry["type"]
    draw = _pick(*entry["values"]) if kind == "text" else _RANGED[kind](*entry["range"])
    return Column(entry["name"], entry["words"], kind, draw)


def _load_schemas() -> tuple[Schema, ...]:
    """The schemas of ``sql.yaml`` (beside this module), in their order."""
    entries = yaml.safe_load(Path(__file__).with_name("sql.yaml").read_text(encoding="utf-8"))["schemas"]
    return tuple(
        Schema(e["table"], e["noun"], _column(e["key"]), tuple(_column(c) for c in e["columns"])) for e in entries
    )


SCHEMAS: tuple[Schema, ...] = _load_schemas()
"""The table kinds examples are drawn from: data, in ``sql.yaml``."""

AGGREGATES = ("", "COUNT", "MIN", "MAX", "SUM", "AVG")
_ASK = {
    "": "What is the {words} of the {noun}",
    "COUNT": "How many {noun}s are there",
    "MIN": "What is the lowest {words} of a {noun}",
    "MAX": "What is the highest {words} of a {noun}",
    "SUM": "What is the total {words} of the {noun}s",
    "AVG": "What is the average {words} of the {noun}s",
}
_SAYS = {"=": "is", ">": "is greater than", "<": "is less than"}


@dataclass(frozen=True)
class Table:
    """A generated table: name, column names, SQL types and rows."""

    name: str
    header: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Value, ...], ...]

    def to_json(self) -> str:
        """The form stored in a row's ``table`` column."""
        data = {"name": self.name, "header": list(self.header), "types": list(self.types), "rows": self.rows}
        return json.dumps(data, separators=(",", ":"))

    def schema_text(self) -> str:
        """The schema as a model reads it: ``table: name (col type, ...)``."""
        return f"table: {self.name} ({', '.join(f'{h} {t}' for h, t in zip(self.header, self.types, strict=True))})"


def _make_table(schema: Schema, rng: random.Random) -> tuple[Table, list[Column]]:
    columns = [schema.key, *rng.sample(schema.columns, k=rng.randint(3, len(schema.columns)))]
    size = rng.randint(4, 7)
    rows: dict[Value, tuple[Value, ...]] = {}
    while len(rows) < size:  # key values are distinct: a row is named by its key
        row = tuple(c.draw(rng) for c in columns)
        rows.setdefault(row[0], row)
    table = Table(schema.table, tuple(c.name for c in columns), tuple(c.type for c in columns), tuple(rows.values()))
    return table, columns


def _literal(value: Value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def _condition(column: Column, value: Value, rng: random.Random) -> tuple[str, str]:
    """(SQL condition, question phrase) true of a row holding ``value`` in ``column``."""
    op = "=" if column.type == "text" else rng.choice(("=", ">", "<"))
    if op == ">":
        value = value - (1 if column.type == "integer" else 0.5)  # type: ignore[operator]
    elif op == "<":
        value = value + (1 if column.type == "integer" else 0.5)  # type: ignore[operator]
    if isinstance(value, float):
        value = round(value, 1)
    return f"{column.name} {op} {_literal(value)}", f"the {column.words} {_SAYS[op]} {value}"


def _example(rng: random.Random) -> dict[str, Any]:
    schema = rng.choice(SCHEMAS)
    table, columns = _make_table(schema, rng)
    row = rng.choice(table.rows)
    aggregate = rng.choice(AGGREGATES)
    numeric = [i for i, c in enumerate(columns) if c.type != "text"]
    if aggregate in ("SUM", "AVG", "MIN", "MAX") and numeric:
        selected = rng.choice(numeric)
    else:
        aggregate = aggregate if aggregate in ("", "COUNT") else ""
        selected = rng.randrange(len(columns))
    others = [i for i in range(len(columns)) if i != selected]
    where = sorted(rng.sample(others, k=min(len(others), rng.randint(1, 3))))
    conditions = [_condition(columns[i], row[i], rng) for i in where]
    # a count's question names no column ("How many players are there"): it counts the key column, so
    # the question alone determines the query
    counted = columns[0].name if aggregate == "COUNT" else columns[selected].name
    target = f"{aggregate}({counted})" if aggregate else counted
    sql = f"SELECT {target} FROM {table.name} WHERE {' AND '.join(c for c, _ in conditions)}"
    ask = _ASK[aggregate].format(words=columns[selected].words, noun=schema.noun)
    question = f"{ask} where {' and '.join(p for _, p in conditions)}?"
    return {
        "instruction": INSTRUCTION,
        "input": f"question: {question} {table.schema_text()}",
        "output": sql,
        "table": table.to_json(),
    }


def iter_sql_examples(num_rows: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Yield ``num_rows`` examples with distinct inputs, deterministic for ``seed``."""
    yield from distinct_examples(_example, _input, num_rows, seed, "text-to-SQL examples")


def _input(example: dict[str, Any]) -> str:
    return str(example["input"])
