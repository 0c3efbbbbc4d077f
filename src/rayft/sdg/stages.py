"""Lazy Ray Data stages that declare the columns they read and write.

A stage is a function over a batch of rows (a list of dicts). :func:`check_plan` walks a list of
stages before anything runs and names the first stage whose input lacks a column it needs;
:func:`apply_stages` chains them lazily with ``map_batches``, checks the columns again on real
batches (the error names the stage and the column), and records the seconds each stage spends in
a per-row column, which the driver sums into the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayft.errors import DataError

if TYPE_CHECKING:
    import ray.data

Row = dict[str, Any]
TIME_PREFIX = "_seconds_"


@dataclass(frozen=True)
class Stage:
    """One step of the SDG pipeline over batches of rows."""

    name: str
    requires: frozenset[str]
    provides: frozenset[str]
    fn: Callable[[list[Row]], list[Row]] | None = None
    """Runs in Ray tasks; None for stages that are applied some other way (the generation pool)."""
    batch_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


def missing_columns(stage: Stage, columns: Iterable[str]) -> list[str]:
    """The columns ``stage`` needs that ``columns`` lacks, sorted."""
    return sorted(stage.requires - set(columns))


def check_plan(stages: list[Stage], initial_columns: Iterable[str]) -> None:
    """Fail before running when a stage would not find a column it needs.

    Raises:
        DataError: naming the stage, the missing columns, and the columns it would get.
    """
    available = set(initial_columns)
    for stage in stages:
        missing = missing_columns(stage, available)
        if missing:
            raise DataError(
                f"SDG stage '{stage.name}' needs column(s) {missing}, but its input has only "
                f"{sorted(available)}; check the seed column names (sdg.question_column, "
                "sdg.answer_column) or the stage order"
            )
        available |= stage.provides


class StageCall:
    """A picklable ``map_batches`` function: check columns, run the stage, time it."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        missing = missing_columns(self.stage, batch.column_names)
        if missing:
            raise DataError(f"SDG stage '{self.stage.name}' got a batch without column(s) {missing}")
        assert self.stage.fn is not None
        started = time.perf_counter()
        rows = self.stage.fn(batch.to_pylist())
        elapsed = time.perf_counter() - started
        for row in rows:
            row[TIME_PREFIX + self.stage.name] = elapsed / max(1, len(rows))
        return pa.Table.from_pylist(rows) if rows else batch.slice(0, 0)


def apply_stage(ds: ray.data.Dataset, stage: Stage) -> ray.data.Dataset:
    """Add one stage to the lazy dataset."""
    return ds.map_batches(
        StageCall(stage),
        batch_size=stage.batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        **stage.options,
    )


def stage_seconds(rows: Iterable[Row]) -> dict[str, float]:
    """Sum the per-row stage times recorded by :class:`StageCall`, by stage name."""
    totals: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(TIME_PREFIX) and value is not None:
                name = key[len(TIME_PREFIX) :]
                totals[name] = totals.get(name, 0.0) + float(value)
    return totals
