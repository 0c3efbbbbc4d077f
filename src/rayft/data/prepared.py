"""The contract between the data plane and the training loop: a prepared (tokenized) dataset.

Preprocessing writes *training units* as parquet files. A unit is what one row of a micro-batch
holds: one example, or, with packing, several examples concatenated up to ``max_seq_length``.
Every unit has these columns:

==================  ===============  ==========================================================
column              type             meaning
==================  ===============  ==========================================================
input_ids           list<int32>      token ids (an encoder-decoder's: the source)
labels              list<int32>      target ids, -100 where no loss is taken (prompt, and the
                                     first token of every packed example after the first); an
                                     encoder-decoder's: the target tokens, all trained, a
                                     sequence of their own length
                                     (see :mod:`rayft.data.seq2seq`)
position_ids        list<int32>      positions, restarting at 0 for every example in the unit
sample_ids          list<int64>      ids of the examples in the unit (row index in the mixture)
num_tokens          int32            len(input_ids) (an encoder-decoder's: + len(labels))
num_label_tokens    int32            count of labels != -100
==================  ===============  ==========================================================

A dataset prepared for ``train.objective: grpo`` with columns to carry to its rewards
(``train.rl.carried_columns``: the 'sql' reward's table, ``train.rl.row_columns``) has one more
column, ``row`` (string): those columns of the example's raw row, as a JSON object. Such units are
never packed (one example each).

Files of a split are read in the order of ``PreparedSplit.files``; that order, and nothing
else, fixes which worker sees which unit (see :mod:`rayft.training.loop.batches`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from rayft.errors import StorageError
from rayft.files import replace_dir, staging_dir
from rayft.security import redact

SPLITS = ("train", "validation")
REJECTED_FILE = "rejected.jsonl"  # beside the splits: row id, source, split, reason of every rejected row
UNIT_COLUMNS = ("input_ids", "labels", "position_ids", "sample_ids", "num_tokens", "num_label_tokens")
IGNORE_INDEX = -100
MANIFEST = "prepared.json"


@dataclass(frozen=True)
class PreparedSplit:
    """One split of a prepared dataset: its parquet files, in reading order, and counts."""

    files: tuple[str, ...]
    num_units: int
    num_examples: int
    num_tokens: int
    num_label_tokens: int

    @classmethod
    def of(cls, files: Sequence[str], units: Sequence[Mapping[str, Any]]) -> PreparedSplit:
        """The split stored in ``files``, counted from the ``units`` written to them."""
        return cls(
            files=tuple(files),
            num_units=len(units),
            num_examples=sum(len(u["sample_ids"]) for u in units),
            num_tokens=sum(u["num_tokens"] for u in units),
            num_label_tokens=sum(u["num_label_tokens"] for u in units),
        )


@dataclass(frozen=True)
class PreparedData:
    """A tokenized, cached dataset ready for training (see the module docstring for the schema)."""

    key: str
    root: str
    train: PreparedSplit
    validation: PreparedSplit | None
    packed: bool
    max_seq_length: int
    stats: dict[str, Any] = field(default_factory=dict)
    seq2seq: bool = False  # units are encoder-decoder source/target pairs (see rayft.data.seq2seq)
    pairs: bool = False  # units are preference pairs (see rayft.data.preference)

    def to_json(self) -> str:
        """Serialise for the manifest written last into ``root``."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PreparedData:
        """Read back what :meth:`to_json` wrote."""
        raw = json.loads(text)
        raw["train"] = _split(raw["train"])
        raw["validation"] = _split(raw["validation"]) if raw.get("validation") else None
        return cls(**raw)

    @classmethod
    def load(cls, root: str | Path) -> PreparedData | None:
        """The prepared dataset in ``root``, or None when its manifest is missing (incomplete)."""
        manifest = Path(root) / MANIFEST
        return cls.from_json(manifest.read_text()) if manifest.is_file() else None


def _split(raw: dict[str, Any]) -> PreparedSplit:
    return PreparedSplit(**{**raw, "files": tuple(raw["files"])})


def unit_schema(*, row: bool = False) -> Any:
    """The Arrow schema of a unit file (see the module docstring), with the ``row`` column when ``row``."""
    import pyarrow as pa

    schema = pa.schema([
        ("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())), ("sample_ids", pa.list_(pa.int64())),
        ("num_tokens", pa.int32()), ("num_label_tokens", pa.int32()),
    ])  # fmt: skip
    return schema.append(pa.field("row", pa.string())) if row else schema


def open_staging(root: Path) -> Path:
    """A fresh staging directory beside ``root`` for a preparation to write into (see :func:`commit_prepared`)."""
    try:
        staging = staging_dir(root)
        staging.chmod(0o755)
        return staging
    except OSError as exc:
        raise StorageError(
            f"data cache: cannot write under {root.parent} ({exc.strerror}); set data.cache_dir or "
            "$RAYFT_DATA_CACHE to a writable directory"
        ) from exc


def commit_prepared(staging: Path, prepared: PreparedData) -> PreparedData:
    """Write the manifest (last) into the fully written ``staging`` and put it in place of its root,
    unless another process finished the same key first; the prepared dataset now at the root."""
    root = Path(prepared.root)
    (staging / MANIFEST).write_text(prepared.to_json())
    if PreparedData.load(root) is None:
        replace_dir(staging, root)
    shutil.rmtree(staging, ignore_errors=True)
    loaded = PreparedData.load(root)
    assert loaded is not None  # just written or written by a concurrent preparer
    return loaded


def write_jsonl_line(handle: IO[str], row: Mapping[str, Any]) -> None:
    """One row of a report (``rejected.jsonl``), masked like every file rayft writes."""
    handle.write(redact(json.dumps(row, ensure_ascii=False)) + "\n")
