"""Symbolic GSM8K variations: every accepted row re-verifies, numbers stay in range, bad seeds are counted."""

from __future__ import annotations

import json
import random
from collections import Counter
from fractions import Fraction

import pytest

from rayft.sdg.mathcheck import ANNOTATION, check_math_answer, evaluate, parse_number, tokenize
from rayft.sdg.rows import SymbolicStage, seed_id
from rayft.sdg.symbolic import TEXT_NUMBER, UnusableSeedError, analyze_seed, make_variation
from tests.conftest import GSM8K_TRAIN

NATALIA_Q = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
NATALIA_A = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def gsm8k_rows(n: int) -> list[dict[str, str]]:
    if not GSM8K_TRAIN.exists():
        pytest.skip(f"{GSM8K_TRAIN} is not available")
    with GSM8K_TRAIN.open() as f:
        return [json.loads(line) for _, line in zip(range(n), f, strict=False)]


def numbers(text: str) -> list[Fraction]:
    return [parse_number(m.group()) for m in TEXT_NUMBER.finditer(text)]


def test_every_accepted_gsm8k_variation_verifies_and_stays_in_range() -> None:
    rows = gsm8k_rows(300)
    accepted, reasons = 0, Counter()
    for index, row in enumerate(rows):
        try:
            chain = analyze_seed(row["question"], row["answer"])
        except UnusableSeedError as skip:
            reasons[skip.reason] += 1
            continue
        rng = random.Random(index)
        for _ in range(2):
            made = make_variation(chain, rng)
            if made is None:
                reasons["no_valid_variation"] += 1
                continue
            question, answer = made
            accepted += 1
            assert check_math_answer(answer) is None, (row, answer)
            assert question != row["question"]
            old, new = numbers(row["question"]), numbers(question)
            assert len(old) == len(new), (row["question"], question)
            for before, after in zip(old, new, strict=True):
                assert after == before or before / 2 <= after <= before * 2, (before, after, question)
            # Results keep their kind: integer steps of the seed stay integer, non-negative stay so.
            seed_results = [parse_number(a.rpartition("=")[2]) for a in ANNOTATION.findall(row["answer"])]
            new_results = [parse_number(a.rpartition("=")[2]) for a in ANNOTATION.findall(answer)]
            for s, n in zip(seed_results, new_results, strict=True):
                assert n >= 0 or s < 0
                assert n.denominator == 1 or s.denominator != 1
    # Real GSM8K: most seeds are usable; the rest are skipped with a reason, never silently.
    assert accepted >= 300, (accepted, reasons)
    assert set(reasons) <= {
        "no_valid_variation",
        "unannotated_number",
        "no_variable_numbers",
        "seed_final_mismatch",
        "seed_no_annotations",
        "seed_annotation_unparsable",
    }, reasons


def test_variation_rewrites_question_answer_and_chain_consistently() -> None:
    chain = analyze_seed(NATALIA_Q, NATALIA_A)
    question, answer = make_variation(chain, random.Random(3)) or ("", "")
    (april,) = {n for n in numbers(question) if n != 48} or {Fraction(48)}
    assert f"{april}/2 = <<{april}/2={april / 2}>>" in answer
    assert answer.endswith(f"#### {april + april / 2}")
    assert april % 2 == 0  # the division stays exact
    assert "half as many" in question


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("She has 3*4 = <<3*4>>12 apples.\n#### 12", "seed_annotation_without_equals"),
        ("She has 3*4 = <<3*4=13>>13 apples.\n#### 13", "seed_annotation_wrong"),
        ("She has 3*4 = <<3*4=12>>12 apples.", "seed_final_line_count"),
        ("She has 3*4 = <<3*4=12>>12 apples.\n#### 12\n#### 12", "seed_final_line_count"),
        ("She has 3*4 = <<3*4=12>>12 apples.\n#### 11", "seed_final_mismatch"),
        ("She has 12 apples.\n#### 12", "seed_no_annotations"),
        ("She has 3x4 = <<3x4=12>>12 apples.\n#### 12", "seed_annotation_unparsable"),
        ("She has 7*4 = <<7*4=28>>28 apples, 5 more.\n#### 28", "unannotated_number"),
    ],
)
def test_malformed_seeds_are_skipped_with_a_reason(answer: str, reason: str) -> None:
    with pytest.raises(UnusableSeedError) as info:
        analyze_seed("Ann has 3 bags of 4 apples. How many apples?", answer)
    assert info.value.reason == reason


def test_seed_numbers_said_in_words_stay_fixed() -> None:
    # 2 also means "half" here, so it must not vary; only 30 does.
    chain = analyze_seed(
        "Tom has 30 cards and 2 friends. He gives half of the cards away. How many are left?",
        "He gives 30/2 = <<30/2=15>>15 cards away.\nHe keeps 30-15 = <<30-15=15>>15.\n#### 15",
    )
    assert chain.inputs == (Fraction(30),)


def test_commas_and_decimals_keep_their_style() -> None:
    chain = analyze_seed(
        "A car costs $1,200 and a bike costs $2.50. What do both cost?",
        "Both cost 1200+2.50 = <<1200+2.50=1202.5>>1202.5 dollars.\n#### 1202.5",
    )
    question, answer = make_variation(chain, random.Random(0)) or ("", "")
    assert check_math_answer(answer) is None
    car, bike = [m.group() for m in TEXT_NUMBER.finditer(question)]
    assert "," in car and len(bike.split(".")[1]) == 2


def test_evaluator_is_exact_and_rejects_code() -> None:
    assert evaluate(tokenize("(1+2)*3/4 - -1")) == Fraction(13, 4)
    assert evaluate(tokenize(".5*4")) == 2
    for bad in ("__import__('os')", "2**3", "1/0"):
        with pytest.raises(ValueError):
            evaluate(tokenize(bad))


def test_symbolic_stage_emits_k_rows_per_seed_with_stable_ids() -> None:
    seeds = [
        {"seed_id": seed_id(NATALIA_Q, NATALIA_A), "seed_question": NATALIA_Q, "seed_answer": NATALIA_A},
        {"seed_id": "bad", "seed_question": "No numbers here?", "seed_answer": "Nothing.\n#### 0"},
    ]
    stage = SymbolicStage(variations=3, max_attempts=50, seed=7, config_hash="h")
    first, second = stage(seeds), stage(seeds)
    assert [r["id"] for r in first] == [r["id"] for r in second]  # deterministic per seed
    assert [r["question"] for r in first] == [r["question"] for r in second]
    good = [r for r in first if r["seed_id"] != "bad"]
    assert len(good) == 3 and all(r["seed_rows"] == 3 for r in good)
    assert len({r["id"] for r in good}) == 3
    (skipped,) = [r for r in first if r["seed_id"] == "bad"]
    assert (skipped["reject_stage"], skipped["seed_rows"], skipped["variation"]) == ("seed", 1, -1)
    assert skipped["reject_reason"] == "seed_no_annotations" and skipped["id"]
