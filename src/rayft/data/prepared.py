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

Files of a split are read in the order of ``PreparedSplit.files``; that order, and nothing
else, fixes which worker sees which unit (see :mod:`rayft.training.loop.batches`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.errors import StorageError
from rayft.files import replace_dir
from rayft.security import redact

if TYPE_CHECKING:
    from rayft.config.data import DataConfig

SPLITS = ("train", "validation")
ROWS_PER_FILE = 2048
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


def write_prepared(
    root: Path,
    key: str,
    *,
    units: dict[str, list[dict[str, Any]]],
    rejected: list[dict[str, Any]],
    stats: dict[str, Any],
    data: DataConfig,
    seq2seq: bool = False,
) -> PreparedData:
    """Write the units, the rejected rows and the manifest (last) into a temp dir, then rename it to ``root``."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root.parent))
    except OSError as exc:
        raise StorageError(
            f"data cache: cannot write under {root.parent} ({exc.strerror}); set data.cache_dir or "
            "$RAYFT_DATA_CACHE to a writable directory"
        ) from exc
    try:
        staging.chmod(0o755)
        splits = {name: write_split(staging, root, name, units[name]) for name in SPLITS}
        _write_jsonl(staging / REJECTED_FILE, rejected)
        validation = splits["validation"] if splits["validation"].num_units else None
        prepared = PreparedData(
            key, str(root), splits["train"], validation, data.packing, data.max_seq_length, stats, seq2seq
        )
        (staging / MANIFEST).write_text(prepared.to_json())
        if PreparedData.load(root) is None:  # another process may have finished the same key first
            replace_dir(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    loaded = PreparedData.load(root)
    assert loaded is not None  # just written or written by a concurrent preparer
    return loaded


def write_split(staging: Path, root: Path, name: str, units: list[dict[str, Any]]) -> PreparedSplit:
    """Write one split's units as parquet files; the recorded paths point into the final ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())), ("sample_ids", pa.list_(pa.int64())),
        ("num_tokens", pa.int32()), ("num_label_tokens", pa.int32()),
    ])  # fmt: skip
    (staging / name).mkdir()
    files = []
    for index, start in enumerate(range(0, len(units), ROWS_PER_FILE)):
        relative = f"{name}/part-{index:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(units[start : start + ROWS_PER_FILE], schema=schema), staging / relative)
        files.append(str(root / relative))
    return PreparedSplit.of(files, units)


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(redact(json.dumps(r, ensure_ascii=False)) + "\n" for r in rows), encoding="utf-8")
