"""What preparation tells about its rows: the rejected rows with their reasons, and the statistics
of a prepared dataset (counts, token lengths, truncation, padding efficiency)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayft.config.data import DataConfig
from rayft.data.prepared import SPLITS
from rayft.errors import DataError

if TYPE_CHECKING:
    from rayft.data.reader import Source
    from rayft.data.split_plan import Record


def collect_rejected(
    rows: Sequence[dict[str, Any]], records: Sequence[Record], sources: Sequence[Source], overlong: str
) -> list[dict[str, Any]]:
    """The report entries of the rejected rows; DataError at the first over-long row with ``overlong: error``."""
    rejected = []
    for row, record in zip(rows, records, strict=True):
        if not row["reason"]:
            continue
        source = sources[record.source].name
        file, line = sources[record.source].origins.at(record.row)
        if row["reason"] == "over_length" and overlong == "error":
            raise DataError(
                f"dataset {source!r} row {record.row}: {row['detail']} ({file} line {line}; data.overlong=error); "
                "raise data.max_seq_length (an encoder-decoder's: data.max_source_length / max_target_length), or "
                "set data.overlong=truncate or drop"
            )
        rejected.append({"row_id": f"{source}:{record.row}", "source": source, "row": record.row, "file": file,
                         "line": line, "split": record.split, "reason": row["reason"],
                         "detail": row["detail"]})  # fmt: skip
    return rejected


def compute_stats(
    rows: Sequence[dict[str, Any]],
    records: Sequence[Record],
    sources: Sequence[Source],
    units: dict[str, list[dict[str, Any]]],
    data: DataConfig,
) -> dict[str, Any]:
    """Row counts, rejections by reason, token length percentiles, truncation and padding efficiency."""
    import numpy as np

    accepted = [r for r in rows if not r["reason"]]
    lengths = np.asarray([r["length"] for r in accepted] or [0])
    train_tokens = sum(u["num_tokens"] for u in units["train"])
    stats: dict[str, Any] = {
        "formats": {s.name: s.format.describe() for s in sources},
        "rows_total": len(records),
        "rows": {name: sum(1 for r in records if r.split == name) for name in SPLITS},
        "examples": {name: sum(len(u["sample_ids"]) for u in units[name]) for name in SPLITS},
        "rejected_total": len(rows) - len(accepted),
        "rejected_by_reason": dict(Counter(r["reason"] for r in rows if r["reason"]).most_common()),
        "tokens_total": train_tokens,
        "label_tokens_total": sum(u["num_label_tokens"] for u in units["train"]),
        "length_percentiles": {f"p{q}": int(np.percentile(lengths, q)) for q in (50, 90, 99)}
        | {"max": int(lengths.max())},
        "truncated": sum(1 for r in accepted if r["truncated"]),
        "truncated_share": sum(1 for r in accepted if r["truncated"]) / max(len(accepted), 1),
    }
    if data.packing and units["train"]:
        stats["padding_efficiency"] = train_tokens / (len(units["train"]) * data.max_seq_length)
    return stats
