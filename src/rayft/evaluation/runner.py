"""Running an evaluation: read the examples, generate with one model, score, summarise.

Generation runs on a pool of Ray actors (:mod:`rayft.generation.ray_pool`) or, for small evals
and machines without Ray, in this process with the same backend. A prompt whose generation
fails is kept: it scores as an empty output and its error is counted and written out.

The examples are read lazily (:class:`ExampleStream`), and what a run keeps of them is a
:class:`ScoreTally`: one number per example and metric, and counters. ``rayft eval`` and
``rayft compare`` stream through :mod:`rayft.evaluation.streaming`; :func:`run_model` holds a
small eval whole (checkpoint scoring during tuning, tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rayft.config import RayftConfig
from rayft.config.data import DatasetConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.generation import GenerationConfig
from rayft.config.inference import GENERATION_WINDOW
from rayft.console import Progress
from rayft.data.read.rows import iter_rows
from rayft.data.read.sources import source_name
from rayft.errors import DataError
from rayft.evaluation.metrics import CorpusMetric
from rayft.evaluation.stats import Estimate, corpus_estimate, estimate
from rayft.evaluation.tasks import Scored, Task, build_prompt, check_tables_present
from rayft.generation.backend import Generation, Prompt
from rayft.generation.openai_http import OpenAIBackend
from rayft.generation.pool import LocalPool, Runtime, in_input_order, open_pool
from rayft.models.sources import ResolvedSource, fingerprint_source, resolve_source
from rayft.runtime import ray_runtime
from rayft.security import mask_uri

log = logging.getLogger("rayft.eval")


@dataclass(frozen=True)
class Example:
    """One evaluation example: where it came from, its question, reference and prompt."""

    id: str
    question: str
    reference: str
    prompt: Prompt
    table: str | None = None  # the example's table as JSON, for tasks that execute (sql)


@dataclass(frozen=True)
class Examples:
    """The examples to score, the few-shot examples shown before each, and the rows left out."""

    items: list[Example]
    fewshot: list[tuple[str, str]]
    skipped: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class CorpusScores:
    """What a corpus metric's estimate and paired test read: per-example statistics and the texts
    (sacrebleu's paired test reads the outputs and references themselves)."""

    metric: CorpusMetric
    statistics: np.ndarray
    outputs: list[str]
    references: list[str]


@dataclass(frozen=True)
class ModelRun:
    """One model's scores on the examples: one value per example and metric, estimates, counters.

    ``generations``, ``scores`` and ``extracted`` are kept by :func:`run_model` only; a streamed
    run's per-example rows are in its ``rows_path`` (see :mod:`rayft.evaluation.streaming`).
    """

    label: str
    source: ResolvedSource
    values: dict[str, np.ndarray]
    metrics: dict[str, Estimate]
    kinds: dict[str, str]
    primary: str
    elapsed_s: float
    generated_tokens: int
    errors: int
    fingerprint: dict[str, Any] = field(default_factory=dict)
    corpus: dict[str, CorpusScores] = field(default_factory=dict)
    generations: list[Generation] = field(default_factory=list)
    scores: list[dict[str, float]] = field(default_factory=list)
    extracted: list[dict[str, str]] = field(default_factory=list)
    rows_path: Path | None = None
    episodes: dict[str, Any] = field(default_factory=dict)
    """The episodes' figures of an eval in an environment (turns, tool calls, errors); empty otherwise."""

    def correct(self, scores: dict[str, float]) -> bool | None:
        """Whether one example's primary score is a correct answer (None for a continuous primary)."""
        return bool(scores.get(self.primary, 0.0) == 1.0) if self.kinds[self.primary] == "binary" else None


class ScoreTally:
    """What a model's run keeps of its examples as they are scored, a window at a time: one value per
    example and metric (8 bytes each), a corpus metric's statistics, and counters; no text, except
    the outputs and references a corpus metric's paired test reads (BLEU)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.n = 0
        self.values: dict[str, array[float]] = {}  # metrics in the order first scored
        self.corpus_rows: dict[str, array[float]] = {name: array("d") for name in task.corpus}
        self.outputs: list[str] = []
        self.references: list[str] = []
        self.errors = 0
        self.generated_tokens = 0
        self.first_error: str | None = None

    def add(
        self, examples: Sequence[Example], generations: Sequence[Generation],
        extra: Sequence[dict[str, float]] | None = None,
    ) -> list[Scored]:  # fmt: skip
        """Score a window of examples (in example order) and keep their values; the scores. ``extra``: more
        scores per example, beside the task's (an episode's reward)."""
        outputs = ["" if g.error else g.text for g in generations]
        references = [e.reference for e in examples]
        scored = self.task.score_all(outputs, references, [e.table for e in examples])
        if extra is not None:
            scored = [
                dataclasses.replace(s, scores={**s.scores, **more}) for s, more in zip(scored, extra, strict=True)
            ]
        for name in dict.fromkeys(k for s in scored for k in s.scores):
            if name not in self.values:  # a metric first seen now scored 0 on the examples before
                self.values[name] = array("d", bytes(8 * self.n))
        for s in scored:
            for name, column in self.values.items():
                column.append(s.scores.get(name, 0.0))
        for name, metric in self.task.corpus.items():
            for output, reference in zip(outputs, references, strict=True):
                self.corpus_rows[name].extend(metric.statistics(output, reference))
        if self.task.corpus:
            self.outputs += outputs
            self.references += references
        for g in generations:
            self.generated_tokens += g.num_generated_tokens
            if g.error:
                self.errors += 1
                self.first_error = self.first_error or g.error
        self.n += len(examples)
        return scored

    def finish(self, label: str, source: ResolvedSource, ev: EvalConfig, elapsed_s: float) -> ModelRun:
        """Every metric estimated with its interval, over the examples added."""
        kinds: dict[str, str] = {}
        metrics: dict[str, Estimate] = {}
        for name, column in self.values.items():
            kinds[name] = kind = self.task.kind(name, column)
            metrics[name] = estimate(column, kind, ev.confidence, ev.bootstrap_samples, ev.seed)
        corpus = {
            name: CorpusScores(metric, np.frombuffer(self.corpus_rows[name]).reshape(self.n, -1), self.outputs,
                               self.references)
            for name, metric in self.task.corpus.items()
        }  # fmt: skip
        for name, c in corpus.items():
            metrics[name] = corpus_estimate(c.statistics, c.metric.from_statistics, ev.confidence,
                                            ev.bootstrap_samples, ev.seed)  # fmt: skip
        if self.errors:
            log.warning("eval: %d of %d generations of %s failed (first: %s)", self.errors, self.n, label,
                        self.first_error)  # fmt: skip
        return ModelRun(
            label=label,
            source=source,
            values={name: np.frombuffer(column) for name, column in self.values.items()},
            metrics=metrics,
            kinds=kinds,
            primary=self.task.primary_of(list(self.values)),
            elapsed_s=elapsed_s,
            generated_tokens=self.generated_tokens,
            errors=self.errors,
            corpus=corpus,
        )


def _columns(ds: DatasetConfig, ev: EvalConfig) -> tuple[str, str]:
    return ds.field_mapping.get("question", ev.question_field), ds.field_mapping.get("answer", ev.answer_field)


Pair = tuple[str, str, str, "str | None"]
"""(id, question, reference, table as JSON or None) of one row."""


def iter_pairs(
    ds: DatasetConfig, ev: EvalConfig, *, tables: bool = False, columns: dict[str, None] | None = None
) -> Iterator[Pair | dict[str, Any]]:
    """Each row of ``ds``, read lazily: its (id, question, reference, table), or, for a row that
    cannot be used, ``{"id", "reason"}``. The table (``eval.table_field``) is read when ``tables``
    is set. ``columns`` (an ordered set), when given, collects the columns seen."""
    question, answer = _columns(ds, ev)
    context = ds.field_mapping.get("table", ev.table_field)
    name = source_name(ds)
    for index, item in enumerate(iter_rows(ds)):
        row_id = f"{name}:{index}"
        row = item.row
        if row is None:
            yield {"id": row_id, "reason": f"{item.reason} ({item.file} line {item.line}: {item.detail})"}
            continue
        if columns is not None:
            columns.update(dict.fromkeys(row))
        bad = [c for c in (question, answer) if not isinstance(row.get(c), str) or not row[c].strip()]
        if bad:
            yield {"id": row_id, "reason": f"empty or non-text {', '.join(bad)}"}
            continue
        yield row_id, row[question], row[answer], _table_text(row.get(context)) if tables else None


def _check_columns(ds: DatasetConfig, ev: EvalConfig, columns: dict[str, None], rows: int) -> None:
    """DataError for a dataset without rows, or without the question or answer column."""
    if not rows:
        raise DataError(f"dataset {ds.path!r} has no rows; check the path, split ({ds.split!r}) and max_rows")
    missing = [c for c in _columns(ds, ev) if c not in columns]
    if missing:
        raise DataError(
            f"eval dataset {ds.path!r} has no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(columns)}); set eval.question_field / eval.answer_field, or the dataset's "
            "field_mapping {question: <column>, answer: <column>}"
        )


def read_pairs(ds: DatasetConfig, ev: EvalConfig, *, tables: bool = False) -> tuple[list[Pair], list[dict[str, Any]]]:
    """(id, question, reference, table) of every usable row of ``ds``, and the rows skipped with reasons."""
    columns: dict[str, None] = {}
    items = list(iter_pairs(ds, ev, tables=tables, columns=columns))
    _check_columns(ds, ev, columns, len(items))
    return [i for i in items if isinstance(i, tuple)], [i for i in items if isinstance(i, dict)]


def _table_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


@dataclass(frozen=True)
class ExampleStream:
    """The scored examples of an eval, read from its datasets lazily each time it is iterated (with
    their prompts); the few-shot examples, the rows skipped and the count come from one pass over
    the datasets made by :func:`open_examples`, which holds no more than a window of rows."""

    ev: EvalConfig
    task: Task
    fewshot: list[tuple[str, str]]
    skipped: list[dict[str, Any]]
    count: int
    offset: int  # usable rows before the first scored one: few-shot examples taken from the eval datasets

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Example]:
        options = _prompt_options(self.ev)
        for row_id, q, a, t in itertools.islice(self._pairs(), self.offset, self.offset + self.count):
            yield Example(row_id, q, a, build_prompt(self.task, q, self.fewshot, **options), t)

    def _pairs(self) -> Iterator[Pair]:
        for ds in self.ev.datasets:
            yield from (p for p in iter_pairs(ds, self.ev, tables=self.task.uses_tables) if isinstance(p, tuple))


def open_examples(ev: EvalConfig, task: Task) -> ExampleStream:
    """The examples of ``ev``, checked in one streamed pass before any generation: columns, few-shot
    rows, a non-empty set, and (sql) every reference query run on its table."""
    offset = 0 if ev.fewshot_dataset is not None else ev.num_fewshot
    end = offset + ev.max_samples if ev.max_samples else None
    skipped: list[dict[str, Any]] = []
    shots: list[tuple[str, str]] = []
    checks: list[Pair] = []
    usable = 0
    tableless: list[int] = []  # [count, first example number] of scored examples without a table
    for ds in ev.datasets:
        columns: dict[str, None] = {}
        rows = 0
        for item in iter_pairs(ds, ev, tables=task.uses_tables, columns=columns):
            rows += 1
            if isinstance(item, dict):
                skipped.append(item)
                continue
            if usable < offset:
                shots.append((item[1], item[2]))
            elif task.uses_tables and (end is None or usable < end):
                if item[3] is None:
                    tableless = [tableless[0] + 1, tableless[1]] if tableless else [1, usable - offset]
                checks.append(item)
                if len(checks) >= GENERATION_WINDOW:
                    _check_tables(task, checks)
            usable += 1
        _check_columns(ds, ev, columns, rows)
    if ev.fewshot_dataset is not None:
        shots = _fewshot(ev)
    if len(shots) < ev.num_fewshot:
        raise DataError(f"eval.num_fewshot={ev.num_fewshot} but only {len(shots)} few-shot rows exist")
    count = max(0, usable - offset) if end is None else max(0, min(usable, end) - offset)
    if not count:
        raise DataError("the eval datasets leave no example to score; add rows or lower eval.num_fewshot")
    for item in skipped:
        log.warning("eval: skipped row %s (%s)", item["id"], item["reason"])
    if tableless:  # scored a window at a time, the examples must all have a table or none
        check_tables_present(tableless[0], count, tableless[1])
    _check_tables(task, checks)
    return ExampleStream(ev, task, shots, skipped, count, offset)


def _fewshot(ev: EvalConfig) -> list[tuple[str, str]]:
    """The first ``num_fewshot`` usable rows of ``eval.fewshot_dataset`` (read no further)."""
    assert ev.fewshot_dataset is not None
    columns: dict[str, None] = {}
    rows = 0
    shots: list[tuple[str, str]] = []
    for item in iter_pairs(ev.fewshot_dataset, ev, columns=columns):
        rows += 1
        if isinstance(item, tuple):
            shots.append((item[1], item[2]))
            if len(shots) >= ev.num_fewshot:
                return shots
    _check_columns(ev.fewshot_dataset, ev, columns, rows)
    return shots


def _check_tables(task: Task, checks: list[Pair]) -> None:
    """Run the task's table check on the pairs gathered, then forget them."""
    if task.check_tables is not None and checks:
        task.check_tables([p[2] for p in checks], [p[3] for p in checks], [p[0] for p in checks])
    checks.clear()


def load_examples(ev: EvalConfig, task: Task) -> Examples:
    """The scored examples of ``ev``, with the few-shot examples already in their prompts, in memory."""
    stream = open_examples(ev, task)
    return Examples(list(stream), stream.fewshot, stream.skipped)


def _prompt_options(ev: EvalConfig) -> dict[str, Any]:
    return {"chat": ev.use_chat_template, "system_prompt": ev.system_prompt, "template": ev.prompt_template}


def generation_config(ev: EvalConfig, source: ResolvedSource, task: Task) -> GenerationConfig:
    """The generation section for one model: the eval's sampling, the source's model and adapter."""
    stop = list(dict.fromkeys([*ev.generation.stop, *task.stop]))
    return ev.generation.model_copy(
        update={
            "model": source.model,
            "adapter_path": source.adapter_path,
            "backend": ev.backend,
            "batch_size": ev.batch_size,
            "concurrency": ev.num_workers,
            "num_cpus_per_actor": ev.num_cpus_per_worker,
            "num_gpus_per_actor": ev.num_gpus_per_worker,
            "stop": stop,
            "endpoint": ev.endpoint,
        }
    )


def eval_source(source: str, cfg: RayftConfig) -> ResolvedSource:
    """What ``rayft eval`` / ``rayft compare`` evaluate for ``source``: with backend 'openai', the model
    of that name on the server at ``eval.endpoint`` (checked to answer and to serve it before any
    example is sent); else the local source resolved (a run directory picks its checkpoint)."""
    if cfg.eval.backend != "openai":
        return resolve_source(source, cfg.model, cfg.eval.checkpoint)
    backend = OpenAIBackend(source, cfg.eval.endpoint)
    try:
        backend.check_serves_model("eval.endpoint")
    finally:
        backend.close()
    return ResolvedSource(source, "model", cfg.model.model_copy(update={"name": source, "gguf_file": None}))


def model_fingerprint(source: ResolvedSource, cfg: GenerationConfig) -> dict[str, Any]:
    """What identifies the evaluated weights: the hashes of local ones; for a served model, whose
    weights the server holds, the model asked for and where."""
    if cfg.backend != "openai":
        return fingerprint_source(source)
    return {"kind": "served", "model": source.model.name, "endpoint": mask_uri(cfg.endpoint.base_url), "sha256": None}


def choose_runtime(setting: str, ray_running: bool, address: str | None) -> Runtime:
    """Where generation runs: 'auto' uses Ray only when it is already there (or an address is set)."""
    if setting == "auto":
        return "ray" if ray_running or address else "local"
    return "ray" if setting == "ray" else "local"


def generate(
    prompts: Sequence[Prompt], cfg: GenerationConfig, runtime: Runtime, *, what: str = "generate"
) -> list[Generation]:
    """One generation per prompt, in order, on the chosen runtime; progress (with ETA) is shown as
    ``what``: done/total prompts.

    Prompts go to the backend longest first within windows of :data:`~rayft.config.inference.GENERATION_WINDOW`
    (so that each batch holds prompts of similar length: less left padding for local models); the
    results are put back in prompt order.
    """
    with Progress(what, len(prompts), unit="prompts") as progress, open_pool(cfg, runtime) as pool:
        windows = in_input_order(prompts, lambda p: p, pool, batch_size=cfg.batch_size, on_batch=progress.advance)
        return [generation for window in windows for _, generation in window]


def _generate_local(prompts: Sequence[Prompt], cfg: GenerationConfig) -> list[Generation]:
    """One generation per prompt in this process, in prompt order with no reordering (the reference
    the longest-first order is measured against)."""
    step = cfg.batch_size
    batches = ((start, list(prompts[start : start + step])) for start in range(0, len(prompts), step))
    return [g for _, generations in LocalPool(cfg).map(batches) for g in generations]


def score_run(
    label: str,
    source: ResolvedSource,
    examples: Examples,
    generations: list[Generation],
    *,
    task: Task,
    ev: EvalConfig,
    elapsed_s: float,
) -> ModelRun:
    """Score one model's generations and estimate every metric with its interval (the generations,
    scores and extracted answers kept in the run)."""
    tally = ScoreTally(task)
    scored = tally.add(examples.items, generations)
    run = tally.finish(label, source, ev, elapsed_s)
    return dataclasses.replace(
        run, generations=generations, scores=[s.scores for s in scored], extracted=[s.extracted for s in scored]
    )


def run_model(
    label: str, source: ResolvedSource, examples: Examples, *, task: Task, ev: EvalConfig, runtime: Runtime
) -> ModelRun:
    """Generate with one model on every example (held in memory) and score the outputs."""
    log.info("eval: %s (%s) on %d examples, %s runtime", label, source.describe(), len(examples.items), runtime)
    started = time.monotonic()
    prompts = [e.prompt for e in examples.items]
    generations = generate(prompts, generation_config(ev, source, task), runtime, what=f"eval {label}")
    return score_run(label, source, examples, generations, task=task, ev=ev, elapsed_s=time.monotonic() - started)


@contextlib.contextmanager
def generation_runtime(cfg: RayftConfig) -> Iterator[Runtime]:
    """Decide where generation runs; for Ray, join or start it for the duration of the block."""
    import importlib.util

    ray_running = False
    if importlib.util.find_spec("ray") is not None:
        import ray

        ray_running = ray.is_initialized()
    runtime = choose_runtime(cfg.eval.runtime, ray_running, cfg.scaling.address)
    if runtime == "local":
        yield runtime
        return
    with ray_runtime(cfg.scaling.address):
        yield runtime
