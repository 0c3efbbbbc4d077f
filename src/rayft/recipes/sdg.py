"""``rayft sdg CONFIG``: synthetic data generation with Ray Data.

Reads top to bottom: settle the output directory and hold its lock, plan the run (the settings'
hash, the lazy Ray Data stages: generate, parse, quality), open the store (resuming when it holds
rows made with the same plan), count the seeds in one streamed pass, read them lazily skipping those
already committed (by id), stream them through the stages a chunk of seeds at a time and commit each
batch as a part file (:mod:`rayft.sdg.runner`), then rebuild data.parquet, data.jsonl, rejected.jsonl
and summary.json from the committed parts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.runs.lock import run_lock
from rayft.runtime import ray_runtime
from rayft.sdg.plan import plan_sdg, resolve_output_dir
from rayft.sdg.runner import generate_and_commit, restore_filters, write_summary
from rayft.sdg.seeds import count_seeds, iter_seeds
from rayft.sdg.store import SdgStore

log = logging.getLogger("rayft.sdg")


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
    plan = plan_sdg(cfg.sdg, cfg.seed, test_mode=test_mode)
    store = SdgStore(out, plan.extra_columns)
    store.open(plan.config_hash)
    done = store.done_seeds()
    num_seeds, num_done = count_seeds(plan.sdg, done)
    filters = restore_filters(plan.sdg, store)
    wall = {"read_seeds": time.monotonic() - started}
    log.info("sdg: %d seeds, %d already done -> %s", num_seeds, num_done, store.root)
    if num_seeds > num_done:
        with ray_runtime(cfg.scaling.address):
            todo = iter_seeds(plan.sdg, skip=done)
            wall.update(
                generate_and_commit(todo, plan.stages, plan.sdg, filters, store, num_seeds=num_seeds - num_done)
            )
    written_at = time.monotonic()
    num_accepted, num_rejected = store.consolidate()
    wall["consolidate"] = time.monotonic() - written_at
    wall["total"] = time.monotonic() - started
    summary = write_summary(plan, store, seeds_requested=num_seeds, seeds_done_before=num_done, wall=wall)
    return SdgResult(
        store.root, store.data_parquet, store.data_jsonl, store.rejected_jsonl, store.summary_json,
        num_accepted, num_rejected, summary,
    )  # fmt: skip
