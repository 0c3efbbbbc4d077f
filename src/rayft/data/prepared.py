"""The contract between the data plane and the training loop: a prepared (tokenized) dataset.

Preprocessing writes *training units* as parquet files. A unit is what one row of a micro-batch
holds: one example, or, with packing, several examples concatenated up to ``max_seq_length``.
Every unit has these columns:

==================  ===============  ==========================================================
column              type             meaning
==================  ===============  ==========================================================
input_ids           list<int32>      token ids
labels              list<int32>      target ids, -100 where no loss is taken (prompt, and the
                                     first token of every packed example after the first)
position_ids        list<int32>      positions, restarting at 0 for every example in the unit
sample_ids          list<int64>      ids of the examples in the unit (row index in the mixture)
num_tokens          int32            len(input_ids)
num_label_tokens    int32            count of labels != -100
==================  ===============  ==========================================================

Files of a split are read in the order of ``PreparedSplit.files``; that order, and nothing
else, fixes which worker sees which unit (see :mod:`rayft.training.batches`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
