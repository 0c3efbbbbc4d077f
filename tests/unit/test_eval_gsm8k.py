"""GSM8K prompt format and answer extraction follow lm-evaluation-harness's rules."""

from __future__ import annotations

import pytest

from rayft.config.evaluation import EvalConfig
from rayft.evaluation import gsm8k
from rayft.evaluation.tasks import build_prompt, build_task

REFERENCE = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    ("output", "strict", "flexible"),
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "72", "72"),
        ("The answer is 72.", gsm8k.INVALID, "72."),
        ("#### 3\nWait, no.\n#### 4", "3", "4"),  # strict takes the first ####, flexible the last number
        ("I think 3, then 5", gsm8k.INVALID, "5"),  # one digit only matches the second group
        ("She has $1,234.50 left.", gsm8k.INVALID, "$1,234.50"),
        ("So she has $1,234.50.", gsm8k.INVALID, "$1,234.50."),
        ("#### -5", "-5", "-5"),
        ("#### 1,000.", "1,000.", "1,000."),
        ("no digits at all", gsm8k.INVALID, gsm8k.INVALID),
        ("", gsm8k.INVALID, gsm8k.INVALID),
        ("####72 without the space", gsm8k.INVALID, "72"),
    ],
)
def test_extractions_follow_the_harness_regexes(output: str, strict: str, flexible: str) -> None:
    assert gsm8k.extract_strict(output) == strict
    assert gsm8k.extract_flexible(output) == flexible


@pytest.mark.parametrize(
    ("extracted", "reference", "correct"),
    [
        ("72", REFERENCE, True),
        ("72.", REFERENCE, True),  # trailing period dropped
        ("$72", REFERENCE, True),  # dollar sign dropped
        ("71", REFERENCE, False),
        ("1,000", "... so 1000 in all.\n#### 1,000", True),  # commas dropped on both sides
        ("1234.50", "#### $1,234.50", True),
        ("72.0", REFERENCE, False),  # the harness compares strings, not numbers
        (gsm8k.INVALID, REFERENCE, False),
    ],
)
def test_normalised_comparison(extracted: str, reference: str, correct: bool) -> None:
    assert gsm8k.is_correct(extracted, reference) is correct


def test_reference_answer_is_the_text_after_hashes() -> None:
    assert gsm8k.reference_answer(REFERENCE) == "72"
    assert gsm8k.reference_answer("#### 1,234") == "1234"


def test_raw_prompt_matches_the_harness_layout() -> None:
    prompt = gsm8k.build_prompt("How many?", [("Q1?", "A1\n#### 1"), ("Q2?", "A2\n#### 2")])
    assert prompt == (
        "Question: Q1?\nAnswer: A1\n#### 1\n\nQuestion: Q2?\nAnswer: A2\n#### 2\n\nQuestion: How many?\nAnswer:"
    )
    assert gsm8k.build_prompt("How many?") == "Question: How many?\nAnswer:"


def test_chat_prompt_puts_fewshot_examples_in_earlier_turns() -> None:
    prompt = gsm8k.build_prompt("How many?", [("Q1?", "A1")], chat=True, system_prompt="Be brief.")
    assert prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question: Q1?\nAnswer:"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Question: How many?\nAnswer:"},
    ]


def test_gsm8k_task_scores_strict_and_flexible_and_stops_at_question() -> None:
    task = build_task(EvalConfig(task="gsm8k"))
    scored = task.score(["#### 72", "The answer is 72.", "#### 70"], [REFERENCE] * 3)
    assert [s.scores for s in scored] == [
        {"accuracy_strict": 1.0, "accuracy_flexible": 1.0},
        {"accuracy_strict": 0.0, "accuracy_flexible": 1.0},
        {"accuracy_strict": 0.0, "accuracy_flexible": 0.0},
    ]
    assert scored[1].extracted == {"strict": gsm8k.INVALID, "flexible": "72."}
    assert "Question:" in task.stop
    assert task.primary == "accuracy_flexible"
    assert build_prompt(task, "Why?", [], chat=False) == "Question: Why?\nAnswer:"
