"""Preference pairs from verified samples: for each problem, ``k`` answers sampled from a model are
checked against the problem's reference, and a verified-correct answer becomes ``chosen`` beside a
wrong one as ``rejected``.

A pure planner: the sampling (a generation backend) and the verdict (e.g. GSM8K's final-answer match)
are the caller's, so the choice of pairs and the counts are tested without a model. Every problem is
accounted for: it gives pairs, or it is counted under the reason it gave none.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

NO_PAIR_REASONS = {
    "no_correct_sample": "none of the k samples reached the reference answer (the problem is too hard for the model)",
    "no_wrong_sample": "every sample reached the reference answer (nothing to prefer it over)",
    "no_distinct_pair": "the correct and the wrong samples are the same text",
}
"""Reason code -> why a problem gave no pair."""


@dataclass(frozen=True)
class Problem:
    """A problem to sample: its id, the prompt the model answers, and the reference answer."""

    id: str
    prompt: str
    reference: str


@dataclass
class PairCounts:
    """How the problems fared: pairs made, samples checked and correct, and problems with no pair by reason."""

    problems: int = 0
    pairs: int = 0
    samples: int = 0
    correct_samples: int = 0
    no_pair: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """The counts for a summary file; ``problems == problems_with_pairs + sum(no_pair)``."""
        with_pairs = self.problems - sum(self.no_pair.values())
        return {"problems": self.problems, "problems_with_pairs": with_pairs, "pairs": self.pairs,
                "samples": self.samples, "correct_samples": self.correct_samples,
                "no_pair": dict(sorted(self.no_pair.items()))}  # fmt: skip


def pairs_for_problem(
    problem: Problem, samples: Sequence[str], is_correct: Callable[[str, str], bool], *, max_pairs: int, seed: int
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to ``max_pairs`` rows ``{id, prompt, chosen, rejected}`` from one problem's samples, or no
    row and the reason (a key of :data:`NO_PAIR_REASONS`).

    Correct and wrong samples are each deduplicated and shuffled by a generator seeded from ``seed``
    and the problem id (so the pairs do not depend on which other problems are in the batch), then
    paired in order: every pair has a different correct and a different wrong answer while both last.
    """
    correct = _unique(s for s in samples if is_correct(s, problem.reference))
    wrong = _unique(s for s in samples if not is_correct(s, problem.reference))
    if not correct:
        return [], "no_correct_sample"
    if not wrong:
        return [], "no_wrong_sample"
    rng = random.Random(f"{seed}:{problem.id}")
    rng.shuffle(correct)
    rng.shuffle(wrong)
    rows = [
        {"id": f"{problem.id}:{index}", "prompt": problem.prompt, "chosen": good, "rejected": bad}
        for index, (good, bad) in enumerate(zip(correct, wrong, strict=False))
        if good.strip() != bad.strip()
    ][:max_pairs]
    return (rows, None) if rows else ([], "no_distinct_pair")


def make_pairs(
    sampled: Iterable[tuple[Problem, Sequence[str]]],
    is_correct: Callable[[str, str], bool],
    counts: PairCounts,
    *,
    max_pairs: int = 1,
    seed: int = 0,
) -> Iterable[dict[str, Any]]:
    """The pair rows of every ``(problem, samples)`` in order, streamed, with ``counts`` kept up to date."""
    for problem, samples in sampled:
        counts.problems += 1
        counts.samples += len(samples)
        counts.correct_samples += sum(1 for s in samples if is_correct(s, problem.reference))
        rows, reason = pairs_for_problem(problem, samples, is_correct, max_pairs=max_pairs, seed=seed)
        if reason is not None:
            counts.no_pair[reason] += 1
        counts.pairs += len(rows)
        yield from rows


def _unique(texts: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(texts))
