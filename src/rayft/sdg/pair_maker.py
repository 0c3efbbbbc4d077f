"""The pair maker's doer: stream the problems through the sampler on Ray Data (k rows per problem,
one generation each), regroup each problem's samples on the driver, check them, and write the pairs
and the problems that gave none as they come.

Layout of the output directory::

    data.jsonl      one pair a line: id, prompt, chosen, rejected (a preference dataset as it is)
    no_pair.jsonl   one problem a line that gave no pair: its id, question, reason, detail, samples
    summary.json    the counts (problems == problems_with_pairs + sum(no_pair)), model, times

Each JSON Lines file is written under a temporary name and renamed into place when every problem is
done, summary.json last: a reader sees a whole output or the previous one, never half of one.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.pairs import PairsConfig
from rayft.console import Progress
from rayft.data.read.rows import iter_rows
from rayft.errors import DataError
from rayft.files import AtomicJsonl, write_text_atomic
from rayft.generation.ray_pool import generate_dataset
from rayft.sdg.dedup import NgramIndex
from rayft.sdg.pair_plan import PairsPlan, problem_of, problem_row, sample_blocks, screen_problem
from rayft.sdg.pairs import AnswerChecker, PairCounts, pairs_for_problem
from rayft.sdg.runner import complete_seed_batches
from rayft.sdg.stages import Row

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("rayft.pairs")

PROBLEMS_PER_DATASET = 256
"""Problems planned as one Ray dataset: the problems held at once."""


@dataclass(frozen=True)
class PairsResult:
    """The files of a pair-making run and its counts."""

    output_dir: Path
    data_jsonl: Path
    no_pair_jsonl: Path
    summary_json: Path
    summary: dict[str, Any]


@dataclass
class _Sink:
    """Where each problem's outcome goes: its pairs, or the reason it gave none, and the counts."""

    data: AtomicJsonl
    no_pair: AtomicJsonl
    counts: PairCounts

    def skip(self, problem_id: str, question: str, reason: str, detail: str) -> None:
        """A problem left out before sampling."""
        self.counts.skip(reason)
        self.no_pair.write({"problem_id": problem_id, "question": question, "reason": reason, "detail": detail})


def make_pairs_on_ray(plan: PairsPlan, checker: AnswerChecker, eval_questions: Iterable[str], out: Path) -> PairsResult:
    """Sample, check and pair every problem of ``plan`` into ``out`` (Ray must be running)."""
    started = time.monotonic()
    pairs = plan.pairs
    leaks = NgramIndex(eval_questions, n=pairs.decontamination.ngram_words,
                       mask_numbers=pairs.decontamination.mask_numbers)  # fmt: skip
    total = sum(1 for _ in iter_problems(pairs))
    data_path, no_pair_path = out / "data.jsonl", out / "no_pair.jsonl"
    with (
        AtomicJsonl(data_path) as data,
        AtomicJsonl(no_pair_path) as no_pair,
        Progress(f"pairs ({plan.model})", total, unit="problems") as progress,
    ):
        sink = _Sink(data, no_pair, PairCounts())
        for chunk in _chunks(iter_problems(pairs), PROBLEMS_PER_DATASET):
            to_sample = []
            for question, answer in chunk:
                row = problem_row(question, str(checker.reference(answer)), answer, pairs)
                screened = screen_problem(question, answer, checker, leaks)
                if screened is None:
                    to_sample.append(row)
                    continue
                sink.skip(row["problem_id"], question, *screened)
                progress.advance(1)
            for rows in sampled_problems(to_sample, plan):
                pair_problem(rows, plan, checker, sink)
                progress.advance(1)
        counts = sink.counts
        if counts.unaccounted() or counts.problems != total:
            raise DataError(
                f"pair counts do not add up ({counts.as_dict()}, {total} problems read); please report this"
            )
        data.commit()
        no_pair.commit()
    summary = {**counts.as_dict(), "model": plan.model, "samples_per_problem": pairs.samples_per_problem,
               "answer_match": pairs.answer_match, "seed": plan.rng_seed,
               "eval_questions": leaks.num_texts, "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    summary_path = write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    log.info("pairs: %d pairs from %d problems -> %s", counts.pairs, counts.problems, data_path)
    return PairsResult(out, data_path, no_pair_path, summary_path, summary)


def pair_problem(rows: list[Row], plan: PairsPlan, checker: AnswerChecker, sink: _Sink) -> None:
    """Check one problem's samples, count them, and write its pairs or why it gave none."""
    rows.sort(key=lambda r: r["sample"])
    problem = problem_of(rows[0])
    texts = [r["generation"] for r in rows if not r["error"]]
    pairs, reason = pairs_for_problem(problem, texts, checker.is_correct, max_pairs=plan.pairs.max_pairs_per_problem,
                                      seed=plan.rng_seed, parses=checker.parses)  # fmt: skip
    sink.counts.add(samples=len(rows), correct=sum(checker.is_correct(t, problem.reference) for t in texts),
                    unparseable=sum(not checker.parses(t) for t in texts), failed=len(rows) - len(texts),
                    pairs=len(pairs), reason=reason)  # fmt: skip
    for pair in pairs:
        sink.data.write({**pair, "problem_id": problem.id})
    if reason is not None:
        errors = sorted({r["error"] for r in rows if r["error"]})
        sink.no_pair.write({"problem_id": problem.id, "question": rows[0]["question"], "reason": reason,
                            "detail": f"reference {problem.reference}" + (f"; errors: {errors[:2]}" if errors else ""),
                            "samples": [r["generation"] for r in rows]})  # fmt: skip


def iter_problems(pairs: PairsConfig) -> Iterator[tuple[str, str]]:
    """The first ``num_problems`` (question, solution) pairs, read lazily, each problem once.

    Raises:
        DataError: a row cannot be read, or lacks the configured columns or text in them.
    """
    where = f"pairs.problems {pairs.problems.path!r}"
    seen: set[tuple[str, str]] = set()
    kept = 0
    for index, item in enumerate(iter_rows(pairs.problems)):
        if pairs.num_problems is not None and kept >= pairs.num_problems:
            return
        if item.row is None:
            raise DataError(f"{where}, {item.file} line {item.line}: {item.reason} ({item.detail}); fix or remove it")
        question, answer = item.row.get(pairs.question_column), item.row.get(pairs.answer_column)
        if not isinstance(question, str) or not isinstance(answer, str) or not question.strip():
            raise DataError(
                f"{where}, row {index}: columns {pairs.question_column!r} and {pairs.answer_column!r} must be "
                f"non-empty text, got {question!r} / {answer!r} (columns: {list(item.row)}); set "
                "pairs.question_column / pairs.answer_column, or fix the row"
            )
        if (question, answer) not in seen:
            seen.add((question, answer))
            kept += 1
            yield question, answer


def sampled_problems(problems: list[Row], plan: PairsPlan) -> Iterator[list[Row]]:
    """Each problem's k sampled rows together, as Ray Data streams them back (in any order)."""
    if not problems:
        return
    batches = build_dataset(problems, plan).iter_batches(batch_size=None, batch_format="pyarrow")
    for rows in complete_seed_batches(batches, key="problem_id", size="samples"):
        by_problem: dict[str, list[Row]] = {}
        for row in rows:
            by_problem.setdefault(row["problem_id"], []).append(row)
        yield from by_problem.values()


def build_dataset(problems: list[Row], plan: PairsPlan) -> ray.data.Dataset:
    """The lazy dataset: the problems' k rows each, one generate batch per block, then the sampler."""
    import pyarrow as pa
    import ray.data

    blocks = sample_blocks(problems, plan.pairs.samples_per_problem, plan.sampler.batch_size)
    return generate_dataset(
        ray.data.from_arrow([pa.Table.from_pylist(rows) for rows in blocks]), plan.sampler, "prompt"
    )


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    source = iter(items)
    while chunk := list(itertools.islice(source, size)):
        yield chunk
