"""Evaluation tasks: how a row becomes a prompt, and how an output is scored against its reference.

One table maps ``eval.task`` to a :class:`Task`; :func:`build_task` turns the config section into
one. A task scores a whole batch at once (BERTScore runs a model), and declares which of its
metrics are correct/incorrect rates (binary: Wilson intervals, McNemar tests) and which are
continuous (bootstrap intervals and tests). A metric of the whole corpus (BLEU) is also named
in ``corpus``: its aggregate, interval and paired test come from the corpus, not from the mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rayft.config.evaluation import EvalConfig
from rayft.errors import DataError
from rayft.evaluation import gsm8k, sql
from rayft.evaluation import metrics as m
from rayft.evaluation.stats import MetricKind
from rayft.generation.backend import Prompt


@dataclass(frozen=True)
class Scored:
    """The scores of one output, and the answers extracted from it (if the task extracts any)."""

    scores: dict[str, float]
    extracted: dict[str, str] = field(default_factory=dict)


Scorer = Callable[[Sequence[str], Sequence[str]], list[Scored]]
TableScorer = Callable[[Sequence[str], Sequence[str], Sequence["str | None"]], list[Scored]]
"""Scores outputs against references on each example's table (JSON text; None when it has none)."""
TableCheck = Callable[[Sequence[str], Sequence["str | None"], Sequence[str]], None]
"""Checks references against their tables before generation (references, tables, example ids)."""


@dataclass(frozen=True)
class Task:
    """A scoring task: prompt format, stop sequences, per-example scorer, metric kinds."""

    name: str
    kinds: dict[str, MetricKind]
    primary: str
    score: Scorer
    stop: tuple[str, ...] = ()
    gsm8k_prompt: bool = False
    corpus: dict[str, m.CorpusMetric] = field(default_factory=dict)
    score_tables: TableScorer | None = None
    check_tables: TableCheck | None = None

    @property
    def uses_tables(self) -> bool:
        """Whether the task reads each example's table (``eval.table_field``)."""
        return self.score_tables is not None

    def score_all(
        self, outputs: Sequence[str], references: Sequence[str], tables: Sequence[str | None]
    ) -> list[Scored]:
        """Score a batch, with each example's table when the task reads tables."""
        if self.score_tables is not None:
            return self.score_tables(outputs, references, tables)
        return self.score(outputs, references)

    def kind(self, metric: str, values: Sequence[float]) -> MetricKind:
        """The declared kind of a metric; metrics a user function adds are binary when all 0/1."""
        if metric in self.kinds:
            return self.kinds[metric]
        return "binary" if all(v in (0.0, 1.0) for v in values) else "continuous"

    def primary_of(self, metrics: Sequence[str]) -> str:
        """The metric a report leads with: the declared one, else the first one scored."""
        return self.primary if self.primary in metrics else next(iter(metrics), self.primary)


def build_prompt(
    task: Task,
    question: str,
    fewshot: Sequence[tuple[str, str]],
    *,
    chat: bool,
    system_prompt: str | None = None,
    template: str | None = None,
) -> Prompt:
    """The prompt for one question: ``template`` with {question} when given, else the task's format
    (gsm8k: the harness's ``Question: ...\nAnswer:``; other tasks: the question itself)."""
    if task.gsm8k_prompt and template is None:
        return gsm8k.build_prompt(question, fewshot, chat=chat, system_prompt=system_prompt)
    fill = (lambda q: template.format(question=q)) if template else (lambda q: q)
    if not chat:
        shots = [f"{fill(q)}\n{a}" for q, a in fewshot]
        return "\n\n".join([*shots, fill(question)])
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for q, a in fewshot:
        messages += [{"role": "user", "content": fill(q)}, {"role": "assistant", "content": a}]
    return [*messages, {"role": "user", "content": fill(question)}]


def _score_gsm8k(outputs: Sequence[str], references: Sequence[str]) -> list[Scored]:
    scored = []
    for output, reference in zip(outputs, references, strict=True):
        strict, flexible = gsm8k.extract_strict(output), gsm8k.extract_flexible(output)
        scores = {
            "accuracy_strict": float(gsm8k.is_correct(strict, reference)),
            "accuracy_flexible": float(gsm8k.is_correct(flexible, reference)),
        }
        scored.append(Scored(scores, {"strict": strict, "flexible": flexible}))
    return scored


def _per_pair(metric: str, fn: Callable[[str, str], float]) -> Scorer:
    def score(outputs: Sequence[str], references: Sequence[str]) -> list[Scored]:
        return [Scored({metric: fn(o, r)}) for o, r in zip(outputs, references, strict=True)]

    return score


def _bertscore(model: str, device: str) -> Scorer:
    def score(outputs: Sequence[str], references: Sequence[str]) -> list[Scored]:
        return [Scored({"bertscore_f1": f}) for f in m.bertscore_f1(outputs, references, model, device)]

    return score


def _custom(path: str) -> Scorer:
    fn = m.load_custom_metric(path)

    def score(outputs: Sequence[str], references: Sequence[str]) -> list[Scored]:
        return [
            Scored(m.custom_scores(fn, o, r, f"example {i}"))
            for i, (o, r) in enumerate(zip(outputs, references, strict=True))
        ]

    return score


def check_tables_present(missing: int, total: int, first: int) -> None:
    """DataError when some examples of the sql task have a table and others not (``missing`` of
    ``total`` without one, the first being example number ``first``)."""
    if missing and missing < total:
        raise DataError(
            f"sql task: {missing} of {total} examples have no table (first: example {first}); give "
            "every example a table for execution accuracy, or none to score by exact match only"
        )


def _score_sql(outputs: Sequence[str], references: Sequence[str], tables: Sequence[str | None]) -> list[Scored]:
    missing = [i for i, t in enumerate(tables) if t is None]
    check_tables_present(len(missing), len(tables), missing[0] if missing else 0)
    rows = zip(outputs, references, tables, strict=True)
    with_tables = [(o, r, t, f"example {i}") for i, (o, r, t) in enumerate(rows) if t is not None]
    executed = iter(sql.score_many(with_tables))  # one sandboxed process per batch of queries
    scored = []
    for output, reference, table in zip(outputs, references, tables, strict=True):
        scores: dict[str, float] = {}
        extracted: dict[str, str] = {}
        if table is not None:
            result = next(executed)
            if isinstance(result, Exception):
                raise result
            correct, got = result
            scores = {"execution_accuracy": float(correct), "invalid_sql_rate": float(got.error is not None)}
            extracted = {"result": got.error or repr(list(got.rows[:5]))[:200]}
        scores["exact_match"] = m.sql_exact_match(output, reference)
        scored.append(Scored(scores, extracted))
    return scored


def _sql_task(cfg: EvalConfig) -> Task:
    kinds: dict[str, MetricKind] = dict.fromkeys(("execution_accuracy", "exact_match", "invalid_sql_rate"), "binary")
    return Task(
        "sql",
        kinds,
        "execution_accuracy",
        lambda outputs, references: _score_sql(outputs, references, [None] * len(outputs)),
        score_tables=_score_sql,
        check_tables=sql.check_references,
    )


def _gsm8k_task(cfg: EvalConfig) -> Task:
    kinds: dict[str, MetricKind] = {"accuracy_strict": "binary", "accuracy_flexible": "binary"}
    return Task("gsm8k", kinds, "accuracy_flexible", _score_gsm8k, gsm8k.STOP_SEQUENCES, gsm8k_prompt=True)


def _simple(name: str, metric: str, kind: MetricKind, fn: Callable[[str, str], float]) -> Callable[[EvalConfig], Task]:
    return lambda cfg: Task(name, {metric: kind}, metric, _per_pair(metric, fn))


def _bleu_task(cfg: EvalConfig) -> Task:
    # Per example: sentence BLEU (rows, disagreements); reported: corpus BLEU and sacrebleu's paired test.
    return Task("bleu", {"bleu": "continuous"}, "bleu", _per_pair("bleu", m.bleu), corpus={"bleu": m.CORPUS_BLEU})


def _bertscore_task(cfg: EvalConfig) -> Task:
    device = "cuda" if cfg.num_gpus_per_worker > 0 else "cpu"
    return Task("bertscore", {"bertscore_f1": "continuous"}, "bertscore_f1", _bertscore(cfg.bertscore_model, device))


def _custom_task(cfg: EvalConfig) -> Task:
    assert cfg.metric is not None  # guaranteed by EvalConfig's validator
    # The primary metric is the first one the function returns (see Task.primary_of).
    return Task("custom", {}, "", _custom(cfg.metric))


TASKS: dict[str, Callable[[EvalConfig], Task]] = {
    "gsm8k": _gsm8k_task,
    "exact_match": _simple("exact_match", "exact_match", "binary", m.exact_match),
    "sql": _sql_task,
    "rouge": _simple("rouge", "rougeL_f1", "continuous", m.rouge_l),
    "bleu": _bleu_task,
    "bertscore": _bertscore_task,
    "custom": _custom_task,
}


def build_task(cfg: EvalConfig) -> Task:
    """The task named by ``cfg.task`` (a custom metric is imported here, so errors come early)."""
    return TASKS[cfg.task](cfg)
