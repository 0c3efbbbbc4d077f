"""What preparation tells about its rows, added up window by window in the driver from the windows'
small summaries (see :mod:`rayft.data.windows`): the rejected rows with their reasons (written to the
report as they come), and the statistics of the prepared dataset (counts, token length percentiles
from a histogram of lengths, truncation, padding efficiency)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from rayft.data.prepared import SPLITS, PreparedSplit, write_jsonl_line
from rayft.errors import DataError

if TYPE_CHECKING:
    from rayft.data.read.rows import Source
    from rayft.data.split_plan import Plan


class Tally:
    """The running totals of a preparation: per split its files and counts, the rejections by
    reason, the kept rows' length histogram and truncations. Its size grows with the number of
    windows and distinct lengths, never with the rows."""

    def __init__(self, plan: Plan, sources: Sequence[Source], overlong: str, report: IO[str]) -> None:
        self.plan, self.sources, self.overlong, self.report = plan, sources, overlong, report
        self.files: dict[str, list[str]] = {name: [] for name in SPLITS}
        self.counts: dict[str, Counter[str]] = {name: Counter() for name in SPLITS}
        self.reasons: Counter[str] = Counter()
        self.lengths: Counter[int] = Counter()
        self.truncated = 0

    def add(self, summary: Mapping[str, Any], root: str) -> None:
        """Add one window's summary (its file named under the final ``root``); the rejected rows go to
        the report. DataError at an over-long row under ``data.overlong: error``."""
        split = summary["split"]
        if summary["file"]:
            self.files[split].append(f"{root}/{summary['file']}")
        for key in ("units", "examples", "tokens", "label_tokens"):
            self.counts[split][key] += int(summary[key])
        self.lengths.update(dict(zip(summary["length_values"], summary["length_counts"], strict=True)))
        self.truncated += int(summary["truncated"])
        rejected = zip(summary["rejected_ids"], summary["rejected_reasons"], summary["rejected_details"], strict=True)
        for sample_id, reason, detail in rejected:
            self.reasons[reason] += 1
            write_jsonl_line(self.report, self._rejected_entry(int(sample_id), reason, detail))

    def _rejected_entry(self, sample_id: int, reason: str, detail: str) -> dict[str, Any]:
        """The report entry of a rejected example: its row id, source file and line, split and reason."""
        source = self.sources[int(self.plan.sources[sample_id])]
        row = int(self.plan.rows[sample_id])
        file, line = source.origins.at(row)
        if reason == "over_length" and self.overlong == "error":
            raise DataError(
                f"dataset {source.name!r} row {row}: {detail} ({file} line {line}; data.overlong=error); "
                "raise data.max_seq_length (an encoder-decoder's: data.max_source_length / max_target_length), or "
                "set data.overlong=truncate or drop"
            )
        return {"row_id": f"{source.name}:{row}", "source": source.name, "row": row, "file": file, "line": line,
                "split": self.plan.split_of(sample_id), "reason": reason, "detail": detail}  # fmt: skip

    @property
    def rejected(self) -> int:
        """Rows rejected so far."""
        return sum(self.reasons.values())

    def split(self, name: str) -> PreparedSplit:
        """The prepared split ``name`` as counted."""
        counts = self.counts[name]
        return PreparedSplit(tuple(self.files[name]), counts["units"], counts["examples"], counts["tokens"],
                             counts["label_tokens"])  # fmt: skip

    def stats(self, packing: bool, max_seq_length: int) -> dict[str, Any]:
        """Row counts, rejections by reason, token length percentiles, truncation and padding efficiency."""
        kept = len(self.plan) - self.rejected
        train = self.counts["train"]
        stats: dict[str, Any] = {
            "formats": {s.name: s.format.describe() for s in self.sources},
            "rows_total": len(self.plan),
            "rows": {"train": self.plan.num_train, "validation": len(self.plan) - self.plan.num_train},
            "examples": {name: self.counts[name]["examples"] for name in SPLITS},
            "rejected_total": self.rejected,
            "rejected_by_reason": dict(self.reasons.most_common()),
            "tokens_total": train["tokens"],
            "label_tokens_total": train["label_tokens"],
            "length_percentiles": {f"p{q}": histogram_percentile(self.lengths, q) for q in (50, 90, 99)}
            | {"max": max(self.lengths, default=0)},
            "truncated": self.truncated,
            "truncated_share": self.truncated / max(kept, 1),
        }
        if packing and train["units"]:
            stats["padding_efficiency"] = train["tokens"] / (train["units"] * max_seq_length)
        return stats


def histogram_percentile(counts: Mapping[int, int], q: float) -> int:
    """The ``q``-th percentile of the values counted in ``counts`` (value -> count), as
    ``int(numpy.percentile(values, q))`` gives it (linear between the two nearest ranks); 0 when empty."""
    total = sum(counts.values())
    if not total:
        return 0
    position = (total - 1) * q / 100
    low, fraction = int(position), position - int(position)
    values = sorted(counts)
    seen = 0
    below = above = values[-1]
    for index, value in enumerate(values):
        seen += counts[value]
        if seen > low:
            below = value
            above = value if seen > low + 1 else values[min(index + 1, len(values) - 1)]
            break
    return int(below + (above - below) * fraction)
