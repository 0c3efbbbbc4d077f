"""Reading SDG's inputs: the seed problems (deduplicated, each with its ``seed_id``) and the
problems of the evaluation sets that synthetic rows must not leak."""

from __future__ import annotations

from rayft.config.sdg import SdgConfig
from rayft.data.sources import read_table
from rayft.errors import DataError
from rayft.sdg.rows import seed_id
from rayft.sdg.stages import Row


def read_seeds(sdg: SdgConfig) -> list[Row]:
    """The first ``num_seeds`` seed rows as seed_id / seed_question / seed_answer.

    Raises:
        DataError: the seed set lacks the configured columns, or a seed has an empty question.
    """
    table = read_table(sdg.seeds)
    columns = (sdg.question_column, sdg.answer_column)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(
            f"sdg seeds {sdg.seeds.path!r} have no column(s) {missing} (columns: {table.column_names}); "
            "set sdg.question_column / sdg.answer_column to the right names"
        )
    if sdg.num_seeds is not None:
        table = table.slice(0, sdg.num_seeds)
    seeds: dict[str, Row] = {}
    for index, row in enumerate(table.select(list(columns)).to_pylist()):
        question, answer = row[sdg.question_column], row[sdg.answer_column]
        if not isinstance(question, str) or not isinstance(answer, str) or not question.strip():
            raise DataError(
                f"sdg seeds {sdg.seeds.path!r}, row {index}: {sdg.question_column!r} and {sdg.answer_column!r} must "
                f"be non-empty text, got {question!r} / {answer!r}; fix or remove the row"
            )
        sid = seed_id(question, answer)
        seeds.setdefault(sid, {"seed_id": sid, "seed_question": question, "seed_answer": answer})
    return list(seeds.values())


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
