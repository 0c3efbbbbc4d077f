"""Running an evaluation: read the examples, generate with one model, score, summarise.

Generation runs on a pool of Ray actors (:mod:`rayft.generation.ray_pool`) or, for small evals
and machines without Ray, in this process with the same backend. A prompt whose generation
fails is kept: it scores as an empty output and its error is counted and written out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayft.config import RayftConfig
from rayft.config.data import DatasetConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.generation import GenerationConfig
from rayft.console import Progress
from rayft.data.sources import read_table, source_name
from rayft.errors import DataError
from rayft.evaluation.metrics import CorpusMetric
from rayft.evaluation.stats import Estimate, corpus_estimate, estimate
from rayft.evaluation.tasks import Task, build_prompt
from rayft.generation.backend import Generation, Prompt
from rayft.generation.pool import LocalPool, Runtime, in_input_order, open_pool
from rayft.models.sources import ResolvedSource, fingerprint_source
from rayft.runtime import ray_runtime

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
    """What a corpus metric's estimate and paired test read: per-example statistics and the texts."""

    metric: CorpusMetric
    statistics: np.ndarray
    outputs: list[str]
    references: list[str]


@dataclass(frozen=True)
class ModelRun:
    """One model's outputs and scores on the examples."""

    label: str
    source: ResolvedSource
    generations: list[Generation]
    scores: list[dict[str, float]]
    extracted: list[dict[str, str]]
    metrics: dict[str, Estimate]
    kinds: dict[str, str]
    primary: str
    elapsed_s: float
    fingerprint: dict[str, Any] = field(default_factory=dict)
    corpus: dict[str, CorpusScores] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        """Tokens generated over every example."""
        return sum(g.num_generated_tokens for g in self.generations)

    @property
    def errors(self) -> int:
        """Examples whose generation failed."""
        return sum(1 for g in self.generations if g.error)


def _columns(ds: DatasetConfig, ev: EvalConfig) -> tuple[str, str]:
    return ds.field_mapping.get("question", ev.question_field), ds.field_mapping.get("answer", ev.answer_field)


Pair = tuple[str, str, str, "str | None"]
"""(id, question, reference, table as JSON or None) of one row."""


def read_pairs(ds: DatasetConfig, ev: EvalConfig, *, tables: bool = False) -> tuple[list[Pair], list[dict[str, Any]]]:
    """(id, question, reference, table) of every usable row of ``ds``, and the rows skipped with reasons.

    The table (``eval.table_field``) is read when ``tables`` is set and the column exists."""
    table = read_table(ds)
    question, answer = _columns(ds, ev)
    missing = [c for c in (question, answer) if c not in table.column_names]
    if missing:
        raise DataError(
            f"eval dataset {ds.path!r} has no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(table.column_names)}); set eval.question_field / eval.answer_field, or the dataset's "
            "field_mapping {question: <column>, answer: <column>}"
        )
    context = ds.field_mapping.get("table", ev.table_field)
    columns = [question, answer, *([context] if tables and context in table.column_names else [])]
    name = source_name(ds)
    pairs: list[Pair] = []
    skipped: list[dict[str, Any]] = []
    for index, row in enumerate(table.select(columns).to_pylist()):
        row_id = f"{name}:{index}"
        bad = [c for c in (question, answer) if not isinstance(row[c], str) or not row[c].strip()]
        if bad:
            skipped.append({"id": row_id, "reason": f"empty or non-text {', '.join(bad)}"})
            continue
        pairs.append((row_id, row[question], row[answer], _table_text(row.get(context)) if len(columns) > 2 else None))
    return pairs, skipped


def _table_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def load_examples(ev: EvalConfig, task: Task) -> Examples:
    """The scored examples of ``ev``, with the few-shot examples already in their prompts."""
    pairs: list[Pair] = []
    skipped: list[dict[str, Any]] = []
    for ds in ev.datasets:
        rows, bad = read_pairs(ds, ev, tables=task.uses_tables)
        pairs += rows
        skipped += bad
    if ev.fewshot_dataset is not None:
        shots = [(q, a) for _, q, a, _ in read_pairs(ev.fewshot_dataset, ev)[0][: ev.num_fewshot]]
    else:
        shots = [(q, a) for _, q, a, _ in pairs[: ev.num_fewshot]]
        pairs = pairs[ev.num_fewshot :]
    if len(shots) < ev.num_fewshot:
        raise DataError(f"eval.num_fewshot={ev.num_fewshot} but only {len(shots)} few-shot rows exist")
    pairs = pairs[: ev.max_samples] if ev.max_samples else pairs
    if not pairs:
        raise DataError("the eval datasets leave no example to score; add rows or lower eval.num_fewshot")
    for item in skipped:
        log.warning("eval: skipped row %s (%s)", item["id"], item["reason"])
    if task.check_tables is not None:
        task.check_tables([p[2] for p in pairs], [p[3] for p in pairs], [p[0] for p in pairs])
    options = _prompt_options(ev)
    items = [Example(row_id, q, a, build_prompt(task, q, shots, **options), t) for row_id, q, a, t in pairs]
    return Examples(items, shots, skipped)


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
        }
    )


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
    """Score one model's generations and estimate every metric with its interval."""
    outputs = ["" if g.error else g.text for g in generations]
    references = [e.reference for e in examples.items]
    scored = task.score_all(outputs, references, [e.table for e in examples.items])
    names = list(dict.fromkeys(k for s in scored for k in s.scores))
    kinds: dict[str, str] = {}
    metrics: dict[str, Estimate] = {}
    for name in names:
        values = [s.scores.get(name, 0.0) for s in scored]
        kind = task.kind(name, values)
        kinds[name] = kind
        metrics[name] = estimate(values, kind, ev.confidence, ev.bootstrap_samples, ev.seed)
    corpus = {name: corpus_scores(metric, outputs, references) for name, metric in task.corpus.items()}
    for name, c in corpus.items():
        metrics[name] = corpus_estimate(c.statistics, c.metric.from_statistics, ev.confidence,
                                        ev.bootstrap_samples, ev.seed)  # fmt: skip
    return ModelRun(
        label=label,
        source=source,
        generations=generations,
        scores=[s.scores for s in scored],
        extracted=[s.extracted for s in scored],
        metrics=metrics,
        kinds=kinds,
        primary=task.primary_of(names),
        elapsed_s=elapsed_s,
        corpus=corpus,
    )


def corpus_scores(metric: CorpusMetric, outputs: list[str], references: list[str]) -> CorpusScores:
    """Per-example statistics of a corpus metric (``len(outputs) x k``)."""
    rows = [metric.statistics(o, r) for o, r in zip(outputs, references, strict=True)]
    return CorpusScores(metric, np.asarray(rows, dtype=np.float64).reshape(len(rows), -1), outputs, references)


def run_model(
    label: str, source: ResolvedSource, examples: Examples, *, task: Task, ev: EvalConfig, runtime: Runtime
) -> ModelRun:
    """Generate with one model on every example and score the outputs."""
    log.info("eval: %s (%s) on %d examples, %s runtime", label, source.describe(), len(examples.items), runtime)
    started = time.monotonic()
    prompts = [e.prompt for e in examples.items]
    generations = generate(prompts, generation_config(ev, source, task), runtime, what=f"eval {label}")
    elapsed = time.monotonic() - started
    failed = sum(1 for g in generations if g.error)
    if failed:
        first = next(g.error for g in generations if g.error)
        log.warning("eval: %d of %d generations of %s failed (first: %s)", failed, len(generations), label, first)
    return score_run(label, source, examples, generations, task=task, ev=ev, elapsed_s=elapsed)


def evaluate_source(
    label: str, resolved: ResolvedSource, examples: Examples, *, task: Task, cfg: RayftConfig, runtime: Runtime
) -> ModelRun:
    """Generate, score and fingerprint one resolved model source."""
    run = run_model(label, resolved, examples, task=task, ev=cfg.eval, runtime=runtime)
    return dataclasses.replace(run, fingerprint=fingerprint_source(resolved))


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
