"""Reading SDG's inputs: the seeds lazily (each seed once, by its content id, and those already done
left out), and the problems of the evaluation sets that synthetic rows must not leak.

The seed set and the decontamination sets are read a line (or a batch of rows) at a time
(:func:`rayft.data.read.rows.iter_rows`); what is kept of the seeds is the set of seed ids seen, so
that a seed repeated in the file runs once.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterable, Iterator

from rayft.config.sdg import SdgConfig, SdgDecontaminationConfig
from rayft.data.read.rows import iter_rows
from rayft.errors import DataError
from rayft.sdg.rows import seed_id
from rayft.sdg.stages import Row

SEED_BLOCKS_PER_DATASET = 64
"""Blocks of ``seeds_per_batch`` seeds planned as one Ray dataset: the seeds held at once."""


def iter_seeds(sdg: SdgConfig, skip: Container[str] = frozenset()) -> Iterator[Row]:
    """The first ``num_seeds`` seed rows as seed_id / seed_question / seed_answer, read lazily, each
    seed once and in file order; seeds whose id is in ``skip`` (committed already) left out.

    Raises:
        DataError: the seed set lacks the configured columns, a seed has an empty question, or a
            row cannot be read.
    """
    columns = (sdg.question_column, sdg.answer_column)
    seen: set[str] = set()
    for index, item in enumerate(itertools.islice(iter_rows(sdg.seeds), sdg.num_seeds)):
        if item.row is None:
            raise DataError(
                f"sdg seeds {sdg.seeds.path!r}, {item.file} line {item.line}: {item.reason} ({item.detail}); "
                "fix or remove the row"
            )
        missing = [c for c in columns if c not in item.row]
        if missing and index == 0:
            raise DataError(
                f"sdg seeds {sdg.seeds.path!r} have no column(s) {missing} (columns: {list(item.row)}); "
                "set sdg.question_column / sdg.answer_column to the right names"
            )
        question, answer = item.row.get(sdg.question_column), item.row.get(sdg.answer_column)
        if not isinstance(question, str) or not isinstance(answer, str) or not question.strip():
            raise DataError(
                f"sdg seeds {sdg.seeds.path!r}, row {index}: {sdg.question_column!r} and {sdg.answer_column!r} must "
                f"be non-empty text, got {question!r} / {answer!r}; fix or remove the row"
            )
        sid = seed_id(question, answer)
        if sid in seen:
            continue
        seen.add(sid)
        if sid not in skip:
            yield {"seed_id": sid, "seed_question": question, "seed_answer": answer}


def count_seeds(sdg: SdgConfig, done: Container[str]) -> tuple[int, int]:
    """(seeds, seeds already done), in one streamed pass over the seed set."""
    total = finished = 0
    for seed in iter_seeds(sdg):
        total += 1
        finished += seed["seed_id"] in done
    return total, finished


def seed_chunks(seeds: Iterable[Row], sdg: SdgConfig) -> Iterator[list[Row]]:
    """The seeds in chunks of :data:`SEED_BLOCKS_PER_DATASET` blocks of ``seeds_per_batch``."""
    source = iter(seeds)
    while chunk := list(itertools.islice(source, sdg.seeds_per_batch * SEED_BLOCKS_PER_DATASET)):
        yield chunk


def read_seeds(sdg: SdgConfig) -> list[Row]:
    """Every seed row at once (see :func:`iter_seeds`, which a run reads them through lazily)."""
    return list(iter_seeds(sdg))


def read_eval_questions(decontamination: SdgDecontaminationConfig) -> list[str]:
    """The problems of every decontamination set (of SDG's rows, or of the pair maker's problems), read
    a row at a time; a row that cannot be read, or a set without the question column, is a DataError."""
    questions: list[str] = []
    column = decontamination.question_column
    for ds in decontamination.datasets:
        columns: dict[str, None] = {}  # ordered set: every column seen, for the message
        for item in iter_rows(ds):
            if item.row is None:
                raise DataError(
                    f"decontamination set {ds.path!r}, {item.file} line {item.line}: {item.reason} ({item.detail}); "
                    "fix or remove the row"
                )
            columns.update(dict.fromkeys(item.row))
            if item.row.get(column):
                questions.append(str(item.row[column]))
        if column not in columns:
            raise DataError(
                f"decontamination set {ds.path!r} has no column {column!r} (columns: {list(columns)}); "
                "set the decontamination section's question_column"
            )
    return questions
