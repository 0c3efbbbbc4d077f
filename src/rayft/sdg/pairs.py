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
from typing import Any, Protocol

NO_PAIR_REASONS = {
    "no_correct_sample": "none of the k samples reached the reference answer (the problem is too hard for the model)",
    "no_wrong_sample": "every sample reached the reference answer (nothing to prefer it over)",
    "no_distinct_pair": "the correct and the wrong samples are the same text",
    "no_parseable_sample": "no sample gave a final answer the checker could read (all unparseable)",
    "generation_failed": "every sample's generation failed (the backend's error is kept with the problem)",
    "eval_overlap": "the problem shares a word n-gram with an evaluation problem (decontamination); not sampled",
    "bad_reference": "the reference solution has no final answer to check against; not sampled",
}
"""Reason code -> why a problem gave no pair."""


class AnswerChecker(Protocol):
    """The verdict on answers, e.g. GSM8K's final-answer match: the reference of a solution, whether
    an answer's final answer can be read, and whether it is the reference."""

    def reference(self, solution: str) -> str | None:
        """The final answer of a reference solution, or None when it has none."""
        ...

    def parses(self, sample: str) -> bool:
        """Whether a final answer can be read from ``sample``."""
        ...

    def is_correct(self, sample: str, reference: str) -> bool:
        """Whether ``sample``'s final answer is ``reference``."""
        ...


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
    problems_with_pairs: int = 0
    pairs: int = 0
    samples: int = 0
    correct_samples: int = 0
    unparseable_samples: int = 0
    failed_samples: int = 0
    no_pair: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        """The counts for a summary file; ``problems == problems_with_pairs + sum(no_pair)``, and the
        samples that were generated are correct, wrong (unparseable ones among them) or failed."""
        with_pairs = self.problems_with_pairs
        wrong = self.samples - self.correct_samples - self.failed_samples
        return {"problems": self.problems, "problems_with_pairs": with_pairs, "pairs": self.pairs,
                "samples": self.samples, "correct_samples": self.correct_samples, "wrong_samples": wrong,
                "unparseable_samples": self.unparseable_samples, "failed_samples": self.failed_samples,
                "no_pair": dict(sorted(self.no_pair.items()))}  # fmt: skip

    def unaccounted(self) -> int:
        """Problems counted neither with pairs nor under a reason (0 unless something is wrong)."""
        return self.problems - self.problems_with_pairs - sum(self.no_pair.values())

    def add(self, *, samples: int, correct: int, unparseable: int, failed: int, pairs: int, reason: str | None) -> None:
        """Count one sampled problem: its samples (``failed`` of them with no text) and its pairs or reason."""
        self.problems += 1
        self.samples += samples
        self.correct_samples += correct
        self.unparseable_samples += unparseable
        self.failed_samples += failed
        self.pairs += pairs
        if reason is None:
            self.problems_with_pairs += 1
        else:
            self.no_pair[reason] += 1

    def skip(self, reason: str) -> None:
        """Count a problem left out before sampling (a key of :data:`NO_PAIR_REASONS`)."""
        self.problems += 1
        self.no_pair[reason] += 1


def pairs_for_problem(
    problem: Problem,
    samples: Sequence[str],
    is_correct: Callable[[str, str], bool],
    *,
    max_pairs: int,
    seed: int,
    parses: Callable[[str], bool] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to ``max_pairs`` rows ``{id, prompt, chosen, rejected}`` from one problem's samples, or no
    row and the reason (a key of :data:`NO_PAIR_REASONS`).

    Correct and wrong samples are each deduplicated and shuffled by a generator seeded from ``seed``
    and the problem id (so the pairs do not depend on which other problems are in the batch), then
    paired in order: every pair has a different correct and a different wrong answer while both last.
    ``samples`` are the generations that did not fail (none: ``generation_failed``); with ``parses``,
    a problem none of whose samples parse is told apart from one whose answers are all wrong.
    """
    if not samples:
        return [], "generation_failed"
    correct = _unique(s for s in samples if is_correct(s, problem.reference))
    wrong = _unique(s for s in samples if not is_correct(s, problem.reference))
    if not correct:
        unreadable = parses is not None and not any(parses(s) for s in samples)
        return [], "no_parseable_sample" if unreadable else "no_correct_sample"
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
    parses: Callable[[str], bool] | None = None,
) -> Iterable[dict[str, Any]]:
    """The pair rows of every ``(problem, samples)`` in order, streamed, with ``counts`` kept up to date."""
    for problem, samples in sampled:
        rows, reason = pairs_for_problem(problem, samples, is_correct, max_pairs=max_pairs, seed=seed, parses=parses)
        counts.add(
            samples=len(samples),
            correct=sum(1 for s in samples if is_correct(s, problem.reference)),
            unparseable=sum(1 for s in samples if not parses(s)) if parses is not None else 0,
            failed=0,
            pairs=len(rows),
            reason=reason,
        )
        yield from rows


def _unique(texts: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(texts))
