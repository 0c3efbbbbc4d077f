"""Exact and near-duplicate removal and decontamination, on constructed cases."""

from __future__ import annotations

from typing import Any

import pytest

from rayft.config.sdg import SdgDecontaminationConfig, SdgDedupConfig
from rayft.sdg.dedup import MinHashLSH, NgramIndex, exact_key
from rayft.sdg.filters import RowFilters
from rayft.sdg.rows import ROW_DEFAULTS

BASE = "A farmer has 12 cows and buys 7 more at the market on Monday. How many cows does the farmer have now?"
RENUMBERED = "A farmer has 30 cows and buys 2 more at the market on Monday. How many cows does the farmer have now?"
REWORDED = "A farmer owns 12 cows and buys 7 more at the market on Monday. How many cows does the farmer have now?"
OTHER = "Lena reads 14 pages a day for 6 days. How many pages has she read in total by the end of the week?"


def row(question: str, seed: str) -> dict[str, Any]:
    return {**ROW_DEFAULTS, "question": question, "seed_id": seed, "answer": "x"}


def test_exact_key_folds_case_and_spacing_only() -> None:
    assert exact_key("How  many\nCows?") == exact_key("how many cows?")
    assert exact_key("How many cows?") != exact_key("How many cows? 2")


def test_minhash_finds_renumbered_and_lightly_reworded_copies_across_seeds() -> None:
    index = MinHashLSH(threshold=0.7, num_perm=128, bands=32, shingle_words=3)
    assert index.find_or_add(BASE, "s1") is None
    assert index.find(RENUMBERED, "s2") == 0  # numbers are masked
    assert index.find(REWORDED, "s2") == 0
    assert index.find(OTHER, "s2") is None
    assert index.find(RENUMBERED, "s1") is None  # the same seed's variations are not compared


def test_minhash_signature_is_stable_across_instances() -> None:
    a = MinHashLSH(threshold=0.8, num_perm=64, bands=16, shingle_words=3)
    b = MinHashLSH(threshold=0.8, num_perm=64, bands=16, shingle_words=3)
    assert (a.signature(BASE) == b.signature(BASE)).all()
    with pytest.raises(ValueError, match="multiple of bands"):
        MinHashLSH(threshold=0.8, num_perm=64, bands=5, shingle_words=3)


def test_ngram_index_catches_a_leaked_test_problem_even_with_new_numbers() -> None:
    leaks = NgramIndex([BASE], n=8, mask_numbers=True)
    assert leaks.overlap(RENUMBERED) is not None
    assert leaks.overlap(OTHER) is None
    # Sharing a short phrase is not a leak.
    assert leaks.overlap("A baker has 4 cakes. How many cows does the farmer own?") is None


def test_filters_reject_with_stage_and_reason_and_keep_the_rest() -> None:
    filters = RowFilters(
        SdgDedupConfig(near_threshold=0.7),
        SdgDecontaminationConfig(ngram_words=8),
        eval_questions=["Lena reads 3 pages a day for 9 days. How many pages has she read in total by the end?"],
    )
    filters.remember(BASE, "old")  # accepted by an earlier run
    rows = [
        row(BASE.lower().replace(" and ", "  and\n"), "s1"),
        row(RENUMBERED, "s2"),
        row(OTHER, "s3"),
        row("Omar bakes 5 trays of 8 rolls each and sells 11 of them. How many rolls does Omar still have?", "s4"),
        row("Omar bakes 5 trays of 8 rolls each and sells 11 of them. How many rolls does Omar still have?", "s4"),
    ]
    filters.apply(rows)
    verdicts = [(r["reject_stage"], r["reject_reason"]) for r in rows]
    assert verdicts == [
        ("dedup_exact", "duplicate"),
        ("dedup_near", "near_duplicate"),
        ("decontaminate", "eval_overlap"),
        ("", ""),
        ("dedup_exact", "duplicate"),
    ]
    assert "shares the n-gram" in rows[2]["reject_detail"]


def test_already_rejected_rows_are_not_judged_again() -> None:
    filters = RowFilters(SdgDedupConfig(), SdgDecontaminationConfig())
    first = {**row(BASE, "s1"), "reject_stage": "quality", "reject_reason": "math_final_mismatch"}
    filters.apply([first])
    second = row(BASE, "s2")
    filters.apply([second])
    assert first["reject_stage"] == "quality"
    assert second["reject_reason"] == ""  # the rejected row never entered the indexes
