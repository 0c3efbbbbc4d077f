"""Writing small prepared datasets directly, for tests of the training loop in isolation.

Units follow :mod:`rayft.data.prepared`: prompt tokens are masked, positions restart per example,
and every unit carries its sample id, so tests can check which samples a run consumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.data.builtin.arithmetic import iter_arithmetic_problems
from rayft.data.prepared import IGNORE_INDEX, PreparedData, PreparedSplit


def qa_unit(tokenizer: Any, question: str, answer: str, sample_id: int) -> dict[str, Any]:
    """One unpacked unit: ``Question: ...`` masked, the answer and EOS trained."""
    prompt = tokenizer(f"Question: {question}\nAnswer: ", add_special_tokens=False)["input_ids"]
    response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = prompt + response
    return {
        "input_ids": ids,
        "labels": [IGNORE_INDEX] * len(prompt) + response,
        "position_ids": list(range(len(ids))),
        "sample_ids": [sample_id],
        "num_tokens": len(ids),
        "num_label_tokens": len(response),
    }


def write_split(directory: Path, units: Sequence[dict[str, Any]], rows_per_file: int = 64) -> PreparedSplit:
    """Write units as parquet files of ``rows_per_file`` rows; return the split description."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for index, start in enumerate(range(0, len(units), rows_per_file)):
        path = directory / f"part-{index:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(list(units[start : start + rows_per_file])), path)
        files.append(str(path))
    return PreparedSplit.of(files, units)


def write_prepared(
    root: Path, train: Sequence[dict[str, Any]], validation: Sequence[dict[str, Any]] = (), max_seq_length: int = 256
) -> PreparedData:
    """A complete prepared dataset (with its manifest) under ``root``."""
    train_split = write_split(root / "train", train)
    val_split = write_split(root / "validation", validation) if validation else None
    prepared = PreparedData(
        key=f"test-{root.name}",
        root=str(root),
        train=train_split,
        validation=val_split,
        packed=False,
        max_seq_length=max_seq_length,
    )
    (root / "prepared.json").write_text(prepared.to_json())
    return prepared


def arithmetic_prepared(
    root: Path, tokenizer: Any, num_train: int, num_validation: int = 0, seed: int = 0
) -> PreparedData:
    """Prepared units of the built-in arithmetic problems (ids 0..n-1 train, then validation)."""
    rows = list(iter_arithmetic_problems(num_train + num_validation, seed=seed))
    units = [qa_unit(tokenizer, r["question"], r["answer"], i) for i, r in enumerate(rows)]
    return write_prepared(root, units[:num_train], units[num_train:])
