"""SDG's doer: stream the seeds through the planned Ray Data stages, filter the rows on the driver
against the whole output (exact and near duplicates, evaluation-set leaks), commit each batch of
whole seeds as a part file, and write the summary of everything committed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rayft.config.sdg import SdgConfig
from rayft.console import Progress
from rayft.errors import DataError, EndpointError, ModelError
from rayft.files import write_text_atomic
from rayft.generation.ray_pool import generate_dataset
from rayft.sdg.filters import RowFilters
from rayft.sdg.plan import SdgPlan
from rayft.sdg.seeds import read_eval_questions, seed_chunks
from rayft.sdg.stages import TIME_PREFIX, Row, Stage, apply_stage, stage_seconds
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import build_summary, part_record
from rayft.sdg.teacher_checks import STAGE as TEACHER_CHECKS
from rayft.sdg.teacher_checks import apply_teacher_checks

if TYPE_CHECKING:
    import ray.data


def restore_filters(sdg: SdgConfig, store: SdgStore) -> RowFilters:
    """The driver's filters, knowing every row already committed (a resumed run dedups against them)."""
    filters = RowFilters(sdg.dedup, sdg.decontamination, read_eval_questions(sdg.decontamination))
    for row in store.committed_accepted():
        filters.remember(row["question"], row["seed_id"])
    return filters


def write_summary(
    plan: SdgPlan, store: SdgStore, *, seeds_requested: int, seeds_done_before: int, wall: dict[str, float]
) -> dict[str, Any]:
    """summary.json of everything committed (stages, rejection reasons, rates, times); returned too."""
    sdg = plan.sdg
    summary = build_summary(
        store.done_records(),
        variations=sdg.variations,
        seeds_requested=seeds_requested,
        seeds_done_before=seeds_done_before,
        wall_seconds=wall,
        extra={
            "generator": sdg.generator,
            "task": sdg.task,
            "config_hash": plan.config_hash,
            "output_dir": str(store.root),
        },
    )
    write_text_atomic(store.summary_json, json.dumps(summary, indent=2) + "\n")
    return summary


def build_dataset(seeds: list[Row], stages: list[Stage], sdg: SdgConfig) -> ray.data.Dataset:
    """The lazy dataset: one block per ``seeds_per_batch`` seeds, then every stage."""
    import pyarrow as pa
    import ray.data

    step = sdg.seeds_per_batch
    ds: ray.data.Dataset = ray.data.from_arrow(
        [pa.Table.from_pylist(seeds[i : i + step]) for i in range(0, len(seeds), step)]
    )
    for stage in stages:
        if stage.fn is not None:
            ds = apply_stage(ds, stage)
        elif stage.name == TEACHER_CHECKS:
            ds = apply_teacher_checks(ds, sdg.teacher, stage.options["checks"])
        else:
            ds = generate_dataset(ds, sdg.teacher, "messages", seconds_column=TIME_PREFIX + stage.name)
    return ds


def generate_and_commit(
    seeds: Iterable[Row], stages: list[Stage], sdg: SdgConfig, filters: RowFilters, store: SdgStore, *, num_seeds: int
) -> dict[str, float]:
    """Stream the rows of ``seeds`` (``num_seeds`` of them, read lazily: a chunk of blocks planned
    at a time) through the stages, filter them, and commit a part per batch."""
    started = time.monotonic()
    filter_s = write_s = 0.0
    number = store.next_part()
    what = f"sdg {sdg.generator}" + (f" ({sdg.teacher.model.name})" if sdg.generator != "symbolic" else "")
    batches = (
        batch
        for chunk in seed_chunks(seeds, sdg)
        for batch in build_dataset(chunk, stages, sdg).iter_batches(batch_size=None, batch_format="pyarrow")
    )
    answered = False  # has any teacher request of this run succeeded yet?
    with Progress(what, num_seeds, unit="seeds") as progress:
        for rows in complete_seed_batches(batches):
            answered = answered or check_teacher_answered(rows, sdg, answered_before=answered)
            t0 = time.monotonic()
            filters.apply(rows)
            t1 = time.monotonic()
            seed_ids = sorted({r["seed_id"] for r in rows})
            record = part_record(rows, seed_ids, stage_seconds(rows))
            accepted = [r for r in rows if not r["reject_reason"]]
            store.commit_part(number, accepted, [r for r in rows if r["reject_reason"]], record)
            number += 1
            filter_s, write_s = filter_s + t1 - t0, write_s + time.monotonic() - t1
            progress.advance(len(seed_ids))
    return {"generate": time.monotonic() - started - filter_s - write_s, "filters": filter_s, "write_parts": write_s}


def check_teacher_answered(rows: list[Row], sdg: SdgConfig, *, answered_before: bool) -> bool:
    """Whether some row of this batch got a teacher's answer; a one-line error when none of the run's has.

    A teacher that fails every request from the start (a wrong address, a refused key, a model that does
    not load) is a failed start, not a batch of bad rows: committing those rows would mark their seeds done
    and a rerun would skip them. So the batch is not committed and the run stops; a rerun after the fix
    goes on from the seeds committed before. Once the teacher has answered, a failed request is a row
    rejected with ``generation_error`` and counted, as any other reject.
    """
    failed = [r for r in rows if r.get("reject_reason") == "generation_error"]
    if answered_before or sdg.generator == "symbolic" or len(failed) < len(rows) or not rows:
        return bool(rows) and len(failed) < len(rows)
    error = EndpointError if sdg.teacher.backend == "openai" else ModelError
    raise error(
        f"sdg: all {len(rows)} teacher requests of the first batch failed (first: {failed[0].get('error')}); "
        "nothing of that batch was committed; fix sdg.teacher and run the same command again to go on"
    )


def complete_seed_batches(
    batches: Iterable[Any], *, key: str = "seed_id", size: str = "seed_rows"
) -> Iterator[list[Row]]:
    """Regroup streamed batches so that each yielded list holds every row of its seeds.

    Every row says how many rows its seed produces (``seed_rows``); rows of seeds still waiting
    for siblings are held back until those arrive, so a committed part never holds half a seed.
    ``key`` and ``size`` name the columns of another grouping (a problem's k samples).
    """
    pending: dict[str, list[Row]] = {}
    for batch in batches:
        for row in batch.to_pylist():
            pending.setdefault(row[key], []).append(row)
        complete = [sid for sid, rows in pending.items() if len(rows) >= rows[0][size]]
        if complete:
            yield [row for sid in complete for row in pending.pop(sid)]
    if pending:
        raise DataError(
            f"{len(pending)} group(s) of {key!r} lost rows between stages (first: {next(iter(pending))}); "
            "please report this as a bug"
        )
