"""Built-in datasets: offline sets addressed as ``builtin:<name>``, with disjoint train and test splits.

They let the quickstart, the tests and the symbolic SDG run with no download: ``builtin:arithmetic``
(GSM8K-style word problems) and ``builtin:sql`` (text-to-SQL over generated tables). A problem belongs to
the test split when a hash of its question falls in a fixed tenth of the hash space, so the two
splits never share a question, whatever sizes are asked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

from rayft.data.builtin.arithmetic import iter_arithmetic_problems
from rayft.data.builtin.sql import iter_sql_examples
from rayft.errors import DataError

PREFIX = "builtin:"
SPLITS = ("train", "test")
DEFAULT_ROWS = {"train": 5000, "test": 500}


def _arithmetic(split: str) -> Iterator[dict[str, Any]]:
    for row in iter_arithmetic_problems(10**9, seed=0):
        if _split_of(row["question"]) == split:
            yield row


def _sql(split: str) -> Iterator[dict[str, Any]]:
    for row in iter_sql_examples(10**9, seed=0):
        if _split_of(row["input"]) == split:
            yield row


BUILTIN_DATASETS: dict[str, Callable[[str], Iterator[dict[str, Any]]]] = {
    "arithmetic": _arithmetic,
    "sql": _sql,
}
"""Name -> a function yielding the rows of a split, in a fixed order."""


def _split_of(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "test" if digest[0] % 10 == 0 else "train"


def is_builtin(path: str) -> bool:
    """Whether a dataset path names a built-in set."""
    return path.startswith(PREFIX)


def load_builtin(path: str, split: str, max_rows: int | None) -> list[dict[str, Any]]:
    """The rows of a built-in set's split: the first ``max_rows`` (or its default size)."""
    name = path[len(PREFIX) :]
    if name not in BUILTIN_DATASETS:
        known = ", ".join(PREFIX + n for n in sorted(BUILTIN_DATASETS))
        raise DataError(f"dataset path {path!r}: no built-in set by that name; built-in sets are: {known}")
    if split not in SPLITS:
        raise DataError(f"dataset {path!r}: split {split!r} does not exist; built-in sets have splits {SPLITS}")
    count = max_rows or DEFAULT_ROWS[split]
    return list(islice(BUILTIN_DATASETS[name](split), count))


def builtin_eval_note(eval_paths: Sequence[str], train_paths: Sequence[str] = ()) -> str | None:
    """A caveat to print beside an evaluation on a built-in set (None when no eval set is built-in):
    its problems are held out, but they come from the same generator, so a gain there is an
    in-distribution result and says nothing about a public benchmark such as GSM8K."""
    builtin = sorted({p for p in eval_paths if is_builtin(p)})
    if not builtin:
        return None
    same = any(p in builtin for p in train_paths)
    source = " (the generator the training data also came from)" if same else ""
    public = [_PUBLIC.get(p, _PUBLIC[PREFIX + "arithmetic"]) for p in builtin]
    return (
        f"measured on held-out problems of rayft's built-in generator {', '.join(builtin)}{source}: an "
        f"in-distribution check, {'; '.join(dict.fromkeys(public))}"
    )


# What a gain on each built-in set is not, and where the real benchmark runs.
_PUBLIC = {
    PREFIX + "arithmetic": "not a GSM8K result; configs/gsm8k-local.yaml runs the same pipeline on real GSM8K",
    PREFIX + "sql": "not a WikiSQL result; configs/t5-text-to-sql.yaml fine-tunes and scores on WikiSQL",
}
