"""Reporting a prepared dataset: the log summary, the rejected-rows report and stats copied into the
run directory, and the stop when too many rows were rejected."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rayft.data.formats import REASONS
from rayft.data.prepared import REJECTED_FILE, PreparedData
from rayft.errors import DataError, StorageError
from rayft.files import replacing

log = logging.getLogger("rayft.data")


def write_report(prepared: PreparedData, report_dir: Path | None) -> None:
    """Copy the rejected-rows report and the stats into ``report_dir`` (atomically, file by file)."""
    if report_dir is None:
        return
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (
            (REJECTED_FILE, (Path(prepared.root) / REJECTED_FILE).read_text(encoding="utf-8")),
            (
                "stats.json",
                json.dumps({"key": prepared.key, "root": prepared.root, **prepared.stats}, indent=2, sort_keys=True),
            ),
        ):
            with replacing(report_dir / name) as handle:
                handle.write(text)
    except OSError as exc:
        raise StorageError(f"data report: cannot write {report_dir} ({exc.strerror}); check its permissions") from exc


def check_rejected(prepared: PreparedData, max_fraction: float, report_dir: Path | None) -> None:
    """Stop with DataError when the rejected share passes ``max_fraction``, naming the top reasons."""
    total = int(prepared.stats["rows_total"])
    rejected = int(prepared.stats["rejected_total"])
    if rejected / max(total, 1) <= max_fraction:
        return
    where = report_dir / REJECTED_FILE if report_dir else Path(prepared.root) / REJECTED_FILE
    raise rejected_error(rejected, total, max_fraction, prepared.stats["rejected_by_reason"], where)


def check_carried(prepared: PreparedData, carry: Sequence[str], report_dir: Path | None) -> None:
    """Stop with DataError when some row lacks a column carried to the rewards: a reward that reads it
    (the 'sql' reward's table) could not score that row, so the run does not start without it."""
    missing = int(prepared.stats.get("rejected_by_reason", {}).get("missing_row_column", 0))
    if not missing:
        return
    where = report_dir / REJECTED_FILE if report_dir else Path(prepared.root) / REJECTED_FILE
    raise DataError(
        f"data: {missing} of {prepared.stats['rows_total']} rows have no value in the column(s) "
        f"{', '.join(map(repr, carry))} that train.rl's rewards read (the rows are listed in {where}); give every "
        "row that column (for the 'sql' reward: the table as JSON with name, header, types, rows), or set "
        "train.rl.rewards[].table_column / train.rl.row_columns to the column that holds it"
    )


def rejected_error(
    rejected: int,
    total: int,
    max_fraction: float,
    reasons: Mapping[str, int],
    where: Path,
    *,
    done_windows: int = 0,
    windows: int = 0,
) -> DataError:
    """The error for too many rejected rows: counts, top reasons, the report and the fixes. With
    ``windows``: preparation stopped after ``done_windows`` of them, so the counts are a floor."""
    top = top_reasons({"rejected_by_reason": reasons})[:3]
    listed = "; ".join(f"{reason}: {count} ({REASONS.get(reason, reason)})" for reason, count in top)
    early = f" in the first {done_windows} of {windows} windows (stopped early)" if windows else ""
    listing = "The rows so far are" if windows else "Every row is"
    return DataError(
        f"data: {rejected} of {total} rows ({rejected / max(total, 1):.1%}) were rejected{early}, more than "
        f"data.max_rejected_fraction={max_fraction}. Top reasons: {listed}. {listing} listed in {where}; "
        "fix the rows, the format/field_mapping, or max_seq_length, or raise data.max_rejected_fraction"
    )


def top_reasons(stats: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Rejection reasons with their counts, most frequent first."""
    counts: Mapping[str, int] = stats["rejected_by_reason"]
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def log_summary(prepared: PreparedData) -> None:
    """Log the counts and token statistics of a prepared dataset."""
    stats = prepared.stats
    log.info(
        "data %s: %d train units (%d examples), %s validation units, %d rejected %s, %d train tokens, lengths %s, "
        "%.1f%% truncated%s",
        prepared.key, prepared.train.num_units, prepared.train.num_examples,
        prepared.validation.num_units if prepared.validation else 0, stats["rejected_total"],
        stats["rejected_by_reason"] or "", stats["tokens_total"], stats["length_percentiles"],
        100 * stats["truncated_share"],
        f", padding efficiency {stats['padding_efficiency']:.3f}" if "padding_efficiency" in stats else "",
    )  # fmt: skip


TRUNCATED_WARN_SHARE = 0.10
"""Share of the kept rows cut to the length limit above which preparation warns: past it, a
noticeable part of the responses (the end of each row) is never trained on."""


def warn_truncated(prepared: PreparedData, limit_setting: str, limit: int) -> str | None:
    """Warn (and return the warning) when more than :data:`TRUNCATED_WARN_SHARE` of the kept rows
    were cut to ``limit`` tokens (``limit_setting`` is the setting that holds it)."""
    stats = prepared.stats
    kept = int(stats["rows_total"]) - int(stats["rejected_total"])
    truncated = int(stats.get("truncated", 0))
    if kept == 0 or truncated / kept <= TRUNCATED_WARN_SHARE:
        return None
    lengths = stats["length_percentiles"]
    message = (
        f"data: {truncated} of {kept} rows ({truncated / kept:.0%}) are longer than {limit_setting}={limit} tokens "
        f"and were cut to it (lengths p50 {lengths['p50']}, p90 {lengths['p90']}, max {lengths['max']}): what "
        f"follows the cut is never trained on. Raise {limit_setting} (to {lengths['p90']} for 90% of the rows "
        "whole), or set data.overlong=drop to train on whole rows only"
    )
    log.warning(message)
    return message
