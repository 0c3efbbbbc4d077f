"""The pair maker's choices and counts: every problem gives pairs or a reason, and the counts add up."""

from __future__ import annotations

from rayft.sdg.pairs import NO_PAIR_REASONS, PairCounts, Problem, make_pairs, pairs_for_problem


def _correct(sample: str, reference: str) -> bool:
    return sample.rstrip().endswith(f"#### {reference}")


P = Problem("p1", "What is 2+2?", "4")


def test_a_correct_and_a_wrong_sample_make_a_pair() -> None:
    rows, reason = pairs_for_problem(P, ["2+2=5 #### 5", "2+2=4 #### 4"], _correct, max_pairs=1, seed=0)
    assert reason is None
    assert rows == [{"id": "p1:0", "prompt": "What is 2+2?", "chosen": "2+2=4 #### 4", "rejected": "2+2=5 #### 5"}]


def test_problems_without_a_pair_say_why() -> None:
    assert pairs_for_problem(P, ["#### 5", "#### 6"], _correct, max_pairs=1, seed=0) == ([], "no_correct_sample")
    assert pairs_for_problem(P, ["a #### 4", "b #### 4"], _correct, max_pairs=1, seed=0) == ([], "no_wrong_sample")
    same = ["#### 4", "#### 4 "]  # correct and wrong differ only in trailing space
    rows, reason = pairs_for_problem(P, same, lambda s, r: s == "#### 4", max_pairs=1, seed=0)
    assert (rows, reason) == ([], "no_distinct_pair")


def test_pairs_use_distinct_answers_and_are_the_same_whatever_the_batch() -> None:
    samples = ["a #### 4", "b #### 4", "a #### 4", "c #### 5", "d #### 6", "e #### 7"]
    rows, _ = pairs_for_problem(P, samples, _correct, max_pairs=5, seed=3)
    assert len(rows) == 2  # two distinct correct answers: two pairs at most
    assert len({r["chosen"] for r in rows}) == 2 and len({r["rejected"] for r in rows}) == 2
    again, _ = pairs_for_problem(P, samples, _correct, max_pairs=5, seed=3)
    assert rows == again


def test_counts_add_up_over_a_stream_of_problems() -> None:
    sampled = [
        (Problem("a", "q", "1"), ["#### 1", "#### 2", "#### 3"]),
        (Problem("b", "q", "1"), ["#### 2", "#### 3"]),
        (Problem("c", "q", "1"), ["#### 1", "x #### 1"]),
        (Problem("d", "q", "1"), ["#### 1", "#### 9"]),
    ]
    counts = PairCounts()
    rows = list(make_pairs(iter(sampled), _correct, counts, max_pairs=1, seed=0))
    summary = counts.as_dict()
    assert [r["id"] for r in rows] == ["a:0", "d:0"]
    assert summary["problems"] == 4 and summary["pairs"] == 2 and summary["samples"] == 9
    assert summary["correct_samples"] == 4
    assert summary["no_pair"] == {"no_correct_sample": 1, "no_wrong_sample": 1}
    assert summary["problems_with_pairs"] + sum(summary["no_pair"].values()) == summary["problems"]
    assert set(summary["no_pair"]) <= set(NO_PAIR_REASONS)
