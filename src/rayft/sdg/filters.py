"""Driver-side filters over the whole output: exact and near duplicates, evaluation-set leaks.

They need every row kept so far (including rows of an earlier, interrupted run), so they run on
the driver, row by row, in the order rows are committed.
"""

from __future__ import annotations

from collections.abc import Iterable

from rayft.config.sdg import SdgDecontaminationConfig, SdgDedupConfig
from rayft.sdg.dedup import MinHashLSH, NgramIndex, exact_key
from rayft.sdg.rows import reject
from rayft.sdg.stages import Row

STAGES = ("dedup_exact", "dedup_near", "decontaminate")


class RowFilters:
    """Exact dedup, near dedup (across seeds) and decontamination, with indexes kept between batches."""

    def __init__(
        self,
        dedup: SdgDedupConfig,
        decontamination: SdgDecontaminationConfig,
        eval_questions: Iterable[str] = (),
    ) -> None:
        self.dedup = dedup
        self._exact: set[int] = set()  # 64-bit keys of the kept questions
        self._near = (
            MinHashLSH(
                threshold=dedup.near_threshold,
                num_perm=dedup.num_perm,
                bands=dedup.bands,
                shingle_words=dedup.shingle_words,
            )
            if dedup.near
            else None
        )
        self._leaks = NgramIndex(
            eval_questions, n=decontamination.ngram_words, mask_numbers=decontamination.mask_numbers
        )

    @property
    def num_eval_questions(self) -> int:
        """How many evaluation problems the leak check compares against."""
        return self._leaks.num_texts

    def remember(self, question: str, seed: str) -> None:
        """Index a row accepted earlier (resume), without judging it."""
        self._exact.add(exact_key(question))
        if self._near is not None:
            self._near.add(question, seed)

    def apply(self, rows: list[Row]) -> list[Row]:
        """Judge rows not yet rejected, in order; accepted ones join the indexes."""
        for row in rows:
            if row["reject_reason"]:
                continue
            reason = self._judge(row)
            if reason is not None:
                reject(row, *reason)
        return rows

    def _judge(self, row: Row) -> tuple[str, str, str] | None:
        question = row["question"]
        key = exact_key(question)
        if self.dedup.exact and key in self._exact:
            return "dedup_exact", "duplicate", "same normalised question as an earlier row"
        leak = self._leaks.overlap(question)
        if leak is not None:
            return "decontaminate", "eval_overlap", f"shares the n-gram {leak!r} with an evaluation problem"
        if self._near is not None:
            match = self._near.find_or_add(question, row["seed_id"])
            if match is not None:
                return "dedup_near", "near_duplicate", f"near duplicate of kept row #{match} from another seed"
        self._exact.add(key)
        return None
