"""The SDG summary: counts at every stage, rejection reasons, acceptance rate, tokens, seconds.

Built from the commit records of every part (so a resumed run reports its whole output) plus the
wall-clock seconds of the current run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rayft.sdg.stages import Row

# Rows flow through these stages in order; a seed that cannot be used is rejected at stage "seed".
STAGE_ORDER = ("generate", "parse", "quality", "teacher_checks", "dedup_exact", "decontaminate", "dedup_near")


def part_record(rows: list[Row], seed_ids: list[str], stage_seconds: dict[str, float]) -> dict[str, Any]:
    """The counts one committed part contributes to the summary."""
    rejected = Counter(f"{r['reject_stage']}/{r['reject_reason']}" for r in rows if r["reject_reason"])
    skipped_seeds = sum(1 for r in rows if r["reject_reason"] and r["variation"] < 0)
    return {
        "seed_ids": seed_ids,
        "rows": sum(1 for r in rows if r["variation"] >= 0),
        "skipped_seeds": skipped_seeds,
        "accepted": sum(1 for r in rows if not r["reject_reason"]),
        "rejected": dict(rejected),
        "tokens_generated": sum(int(r.get("num_generated_tokens") or 0) for r in rows),
        "stage_seconds": stage_seconds,
    }


def build_summary(
    records: list[dict[str, Any]],
    *,
    variations: int,
    seeds_requested: int,
    seeds_done_before: int,
    wall_seconds: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Aggregate part records into the summary written to summary.json and printed by the CLI."""
    rejected: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for record in records:
        rejected.update(record["rejected"])
        seconds.update(record["stage_seconds"])
    seeds = sum(len(r["seed_ids"]) for r in records)
    skipped = sum(r["skipped_seeds"] for r in records)
    accepted = sum(r["accepted"] for r in records)
    requested_rows = (seeds - skipped) * variations
    stages = []
    remaining = requested_rows
    for stage in STAGE_ORDER:
        dropped = sum(n for key, n in rejected.items() if key.startswith(f"{stage}/"))
        stages.append({"stage": stage, "rows_in": remaining, "rejected": dropped, "rows_out": remaining - dropped})
        remaining -= dropped
    return {
        "seeds": {
            "requested": seeds_requested,
            "done_before_this_run": seeds_done_before,
            "processed": seeds,
            "skipped": skipped,
        },
        "rows": {"requested": seeds * variations, "candidates": requested_rows, "accepted": accepted},
        "stages": stages,
        "rejection_reasons": dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        "acceptance_rate": accepted / (seeds * variations) if seeds else 0.0,
        "tokens_generated": sum(r["tokens_generated"] for r in records),
        "stage_seconds": {k: round(v, 3) for k, v in seconds.items()},
        "wall_seconds": {k: round(v, 3) for k, v in wall_seconds.items()},
        **(extra or {}),
    }
