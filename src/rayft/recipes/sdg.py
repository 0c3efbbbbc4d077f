"""``rayft sdg CONFIG``: synthetic data generation with Ray Data.

Reads top to bottom: settle the output directory (resuming when it holds rows made with the same
config), count the seeds in one streamed pass, read them lazily skipping those already committed
(by id), plan the lazy Ray Data stages a chunk of seeds at a time (generate, parse, quality),
stream their rows to the driver, filter them there against the whole output
(exact and near duplicates, evaluation-set leaks), commit each batch as a part file, and finally
rebuild data.parquet, data.jsonl, rejected.jsonl and summary.json from the committed parts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config import RayftConfig
from rayft.config.sdg import SdgConfig
from rayft.console import Progress
from rayft.data.sources import read_table
from rayft.errors import DataError
from rayft.files import write_text_atomic
from rayft.generation.ray_pool import generate_dataset
from rayft.runs.location import local_run_dir
from rayft.runs.lock import run_lock
from rayft.runtime import ray_runtime
from rayft.sdg.filters import RowFilters
from rayft.sdg.rows import SEED_COLUMNS, ParseStage, PromptStage, QualityStage, SymbolicStage
from rayft.sdg.seeds import count_seeds, iter_seeds, seed_chunks
from rayft.sdg.stages import TIME_PREFIX, Row, Stage, apply_stage, check_plan, stage_seconds
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import build_summary, part_record
from rayft.sdg.teacher_checks import STAGE as TEACHER_CHECKS
from rayft.sdg.teacher_checks import TeacherChecks, apply_teacher_checks

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("rayft.sdg")

TEST_MODE_SEEDS = 2
GENERATION_COLUMNS = frozenset({"generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens"})
ROW_COLUMNS = frozenset({"id", "seed_id", "variation", "question", "answer", "reject_reason", "seed_rows"})
# Fields that do not change which rows are made: they may differ when a run is resumed.
_VOLATILE_FIELDS = ("num_seeds", "output_dir", "seeds_per_batch")
_VOLATILE_TEACHER_FIELDS = ("batch_size", "concurrency", "num_cpus_per_actor", "num_gpus_per_actor", "endpoint")


@dataclass(frozen=True)
class SdgResult:
    """What a finished ``rayft sdg`` run produced."""

    output_dir: Path
    data_parquet: Path
    data_jsonl: Path
    rejected_jsonl: Path
    summary_json: Path
    num_accepted: int
    num_rejected: int
    summary: dict[str, Any]


def run(cfg: RayftConfig, *, output_dir: Path | None = None, test_mode: bool = False) -> SdgResult:
    """Generate, verify, deduplicate and write synthetic rows from ``cfg.sdg``; resume if interrupted.

    The output directory's lock is held throughout: a second driver writing the same rows is refused.
    """
    out = resolve_output_dir(cfg, output_dir)
    with run_lock(out, command="rayft sdg"):
        return generate(cfg, out, test_mode=test_mode)


def generate(cfg: RayftConfig, out: Path, *, test_mode: bool = False) -> SdgResult:
    """The work of :func:`run`, into ``out``."""
    started = time.monotonic()
    sdg = cfg.sdg.model_copy(update={"num_seeds": TEST_MODE_SEEDS}) if test_mode else cfg.sdg
    rng_seed = sdg.seed if sdg.seed is not None else cfg.seed
    config_hash = sdg_config_hash(sdg, rng_seed)
    store = SdgStore(out)
    store.open(config_hash)

    done = store.done_seeds()
    num_seeds, num_done = count_seeds(sdg, done)
    stages = plan_stages(sdg, rng_seed, config_hash)
    check_plan(stages, SEED_COLUMNS)
    filters = RowFilters(sdg.dedup, sdg.decontamination, read_eval_questions(sdg))
    for row in store.committed_accepted():
        filters.remember(row["question"], row["seed_id"])
    wall = {"read_seeds": time.monotonic() - started}
    log.info("sdg: %d seeds, %d already done -> %s", num_seeds, num_done, store.root)

    if num_seeds > num_done:
        with ray_runtime(cfg.scaling.address):
            todo = iter_seeds(sdg, skip=done)
            wall.update(generate_and_commit(todo, stages, sdg, filters, store, num_seeds=num_seeds - num_done))
    written_at = time.monotonic()
    num_accepted, num_rejected = store.consolidate()
    wall["consolidate"] = time.monotonic() - written_at
    wall["total"] = time.monotonic() - started
    summary = build_summary(
        store.done_records(),
        variations=sdg.variations,
        seeds_requested=num_seeds,
        seeds_done_before=num_done,
        wall_seconds=wall,
        extra={"generator": sdg.generator, "task": sdg.task, "config_hash": config_hash, "output_dir": str(store.root)},
    )
    write_text_atomic(store.summary_json, json.dumps(summary, indent=2) + "\n")
    return SdgResult(
        store.root,
        store.data_parquet,
        store.data_jsonl,
        store.rejected_jsonl,
        store.summary_json,
        num_accepted,
        num_rejected,
        summary,
    )


def resolve_output_dir(cfg: RayftConfig, output_dir: Path | None) -> Path:
    """The explicit directory, else ``sdg.output_dir``, else ``<storage_path>/<name>/sdg``."""
    if output_dir is not None:
        return Path(output_dir)
    if cfg.sdg.output_dir:
        return Path(cfg.sdg.output_dir)
    fix = "set sdg.output_dir=/a/local/dir"
    return local_run_dir(cfg.storage_path, cfg.name, command="rayft sdg", fix=fix) / "sdg"


def sdg_config_hash(sdg: SdgConfig, rng_seed: int) -> str:
    """A hash of every setting that changes which rows are made (not sizes or scaling)."""
    data = sdg.model_dump(mode="json", exclude=set(_VOLATILE_FIELDS))
    if sdg.generator == "symbolic":
        data.pop("teacher"), data.pop("prompts")
    else:
        for key in _VOLATILE_TEACHER_FIELDS:
            data["teacher"].pop(key)
    data["rng_seed"] = rng_seed
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def read_seeds(sdg: SdgConfig) -> list[Row]:
    """The first ``num_seeds`` seed rows as seed_id / seed_question / seed_answer (see
    :func:`rayft.sdg.seeds.iter_seeds`, which the run reads them through lazily)."""
    return list(iter_seeds(sdg))


def read_eval_questions(sdg: SdgConfig) -> list[str]:
    """The problems of every decontamination set."""
    questions: list[str] = []
    column = sdg.decontamination.question_column
    for ds in sdg.decontamination.datasets:
        table = read_table(ds)
        if column not in table.column_names:
            raise DataError(
                f"decontamination set {ds.path!r} has no column {column!r} (columns: {table.column_names}); "
                "set sdg.decontamination.question_column"
            )
        questions.extend(str(q) for q in table.column(column).to_pylist() if q)
    return questions


def plan_stages(sdg: SdgConfig, rng_seed: int, config_hash: str) -> list[Stage]:
    """The Ray Data stages for the configured generator, in order (a pure planner: nothing runs)."""
    quality = Stage(
        "quality",
        ROW_COLUMNS,
        frozenset(),
        QualityStage(
            verify_math=sdg.quality.verify_math and sdg.task == "math",
            min_question_chars=sdg.quality.min_question_chars,
            max_question_chars=sdg.quality.max_question_chars,
            min_answer_chars=sdg.quality.min_answer_chars,
            max_answer_chars=sdg.quality.max_answer_chars,
        ),
    )
    checks = plan_teacher_checks(sdg)
    if sdg.generator == "symbolic":
        generate = SymbolicStage(sdg.variations, sdg.max_attempts, rng_seed, config_hash)
        return [Stage("generate", SEED_COLUMNS, ROW_COLUMNS, generate), quality, *checks]
    teacher = sdg.teacher
    sampling = json.dumps(
        {"temperature": teacher.temperature, "top_p": teacher.top_p, "max_new_tokens": teacher.max_new_tokens}
    )
    template = sdg.prompts.math_variation if sdg.task == "math" else sdg.prompts.instruction
    prompts = PromptStage(template, sdg.prompts.system, sdg.variations, teacher.model.name, sampling, config_hash)
    return [
        Stage("prompts", SEED_COLUMNS, ROW_COLUMNS | {"messages"}, prompts),
        Stage("generate", frozenset({"messages"}), GENERATION_COLUMNS, None),
        Stage("parse", ROW_COLUMNS | GENERATION_COLUMNS, frozenset(), ParseStage(sdg.task)),
        quality,
        *checks,
    ]


def plan_teacher_checks(sdg: SdgConfig) -> list[Stage]:
    """The optional stage that asks the teacher (self-consistency, judge); empty when both are off."""
    q = sdg.quality
    samples = q.self_consistency if sdg.task == "math" else 0
    if not samples and not q.judge:
        return []
    checks = TeacherChecks(
        samples=samples,
        min_agree=q.self_consistency_min_agree,
        judge=q.judge,
        min_score=q.judge_min_score,
        solve_prompt=sdg.prompts.solve,
        judge_prompt=sdg.prompts.judge,
        system=sdg.prompts.system,
    )
    return [Stage(TEACHER_CHECKS, ROW_COLUMNS, frozenset(), None, options={"checks": checks})]


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
    with Progress(what, num_seeds, unit="seeds") as progress:
        for rows in complete_seed_batches(batches):
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


def complete_seed_batches(batches: Iterable[Any]) -> Iterator[list[Row]]:
    """Regroup streamed batches so that each yielded list holds every row of its seeds.

    Every row says how many rows its seed produces (``seed_rows``); rows of seeds still waiting
    for siblings are held back until those arrive, so a committed part never holds half a seed.
    """
    pending: dict[str, list[Row]] = {}
    for batch in batches:
        for row in batch.to_pylist():
            pending.setdefault(row["seed_id"], []).append(row)
        complete = [sid for sid, rows in pending.items() if len(rows) >= rows[0]["seed_rows"]]
        if complete:
            yield [row for sid in complete for row in pending.pop(sid)]
    if pending:
        raise DataError(
            f"{len(pending)} seed(s) lost rows between SDG stages (first: {next(iter(pending))}); "
            "please report this as a bug"
        )
