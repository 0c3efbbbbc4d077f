"""``rayft eval`` and ``rayft compare`` on a stream of examples, with memory that does not grow with them.

Each model reads the examples lazily (:class:`~rayft.evaluation.runner.ExampleStream`) into one
long-lived generation pool, a window at a time, longest first within a window
(:func:`~rayft.generation.pool.in_input_order`). Each window is scored as it finishes, and its
per-example rows are appended, in input order, to a hidden scratch file beside the report; the
process keeps a :class:`~rayft.evaluation.runner.ScoreTally` (a number per example and metric, and
counters). Once every example is scored, the reports are written from the scratch files a line at a
time: ``predictions.jsonl`` for one model, ``examples.jsonl`` joining every model's rows for a
comparison (keeping the examples where the models disagree most for the Markdown and HTML pages),
each to a temporary file renamed into place. The scratch files are removed on the way out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.console import Progress
from rayft.evaluation.report import MAX_DISAGREEMENTS, comparison_row, example_record, prediction_row, spread
from rayft.evaluation.runner import ExampleStream, ModelRun, ScoreTally, generation_config, model_fingerprint
from rayft.evaluation.tasks import Task
from rayft.files import AtomicJsonl, temp_path
from rayft.generation.pool import Runtime, in_input_order, open_pool
from rayft.models.sources import ResolvedSource
from rayft.security import mask_uri, redact

log = logging.getLogger("rayft.eval")


@contextlib.contextmanager
def scratch_files(beside: Path, count: int) -> Iterator[list[Path]]:
    """``count`` hidden scratch paths beside ``beside`` (one per model), removed on the way out."""
    paths = [temp_path(beside, f"rows{i}") for i in range(count)]
    try:
        yield paths
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def stream_model(
    label: str,
    source: ResolvedSource,
    examples: ExampleStream,
    rows_path: Path,
    *,
    task: Task,
    cfg: RayftConfig,
    runtime: Runtime,
) -> ModelRun:
    """Generate with one model on every example, score each window as it finishes and append its
    example rows, in input order, to ``rows_path``; the run keeps the tally, not the rows."""
    ev = cfg.eval
    gen_cfg = generation_config(ev, source, task)
    served = f" at {mask_uri(gen_cfg.endpoint.base_url)}" if gen_cfg.backend == "openai" else ""
    log.info("eval: %s (%s%s) on %d examples, %s runtime", label, source.describe(), served, examples.count, runtime)
    tally = ScoreTally(task)
    started = time.monotonic()
    with (
        rows_path.open("w", encoding="utf-8") as out,
        Progress(f"eval {label}", examples.count, unit="prompts") as progress,
        open_pool(gen_cfg, runtime) as pool,
    ):
        windows = in_input_order(
            examples, lambda e: e.prompt, pool, batch_size=gen_cfg.batch_size, on_batch=progress.advance
        )
        for window in windows:
            items, generations = [e for e, _ in window], [g for _, g in window]
            for item in zip(items, generations, tally.add(items, generations), strict=True):
                out.write(redact(json.dumps(example_record(*item), ensure_ascii=False)) + "\n")
    run = tally.finish(label, source, ev, time.monotonic() - started)
    return dataclasses.replace(run, fingerprint=model_fingerprint(source, gen_cfg), rows_path=rows_path)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The example rows of a scratch file, a line at a time."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


def _rows_of(run: ModelRun) -> Iterator[dict[str, Any]]:
    if run.rows_path is None:
        raise ValueError(f"model run {run.label!r} was not streamed: it has no rows file")
    return read_records(run.rows_path)


def write_predictions(path: Path, run: ModelRun) -> Path:
    """``predictions.jsonl`` of a streamed run, a row at a time, each with its ``correct``."""
    with AtomicJsonl(path) as out:
        for record in _rows_of(run):
            out.write(prediction_row(record, run))
        out.commit()
    return path


def write_comparison(path: Path, runs: Sequence[ModelRun], primary: str) -> list[dict[str, Any]]:
    """``examples.jsonl`` joining the streamed runs' rows a line at a time; the examples where the
    models' ``primary`` scores differ most (at most :data:`MAX_DISAGREEMENTS`, ties in input
    order), which are what the Markdown and HTML reports show."""
    kept: list[tuple[float, int, dict[str, Any]]] = []  # a min-heap: the least different first
    with AtomicJsonl(path) as out:
        for index, records in enumerate(zip(*(_rows_of(r) for r in runs), strict=True)):
            row = comparison_row(records, runs)
            out.write(row)
            difference = spread(row, primary)
            if difference > 0:
                heapq.heappush(kept, (difference, -index, row))
                if len(kept) > MAX_DISAGREEMENTS:
                    heapq.heappop(kept)
        out.commit()
    return [row for _, _, row in sorted(kept, key=lambda item: (-item[0], -item[1]))]
