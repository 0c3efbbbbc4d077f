"""Preference rows in the shapes users bring, their rejects, and the truncation that keeps the
prompt's end; labels are checked by decoding exactly the trained tokens of each side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayft.config.data import DatasetConfig
from rayft.data.formats import BadRowError
from rayft.data.preference import PreferenceExample, fit_pair, make_preference, tokenize_preference
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.tokenize import TextTokenizer

DS = DatasetConfig(path="pairs.jsonl")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer

    return load_tokenizer(ModelConfig(name=str(tiny_model_dir)))


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": [_user("What is 2+2?")], "chosen": [_assistant("4")], "rejected": [_assistant("5")]},
        {"chosen": [_user("What is 2+2?"), _assistant("4")], "rejected": [_user("What is 2+2?"), _assistant("5")]},
        {"prompt": [{"from": "human", "value": "What is 2+2?"}], "chosen": "4", "rejected": "5"},
    ],
    ids=["strings", "conversational", "ultrafeedback", "sharegpt-prompt"],
)
def test_every_shape_becomes_the_same_pair(row: dict[str, Any]) -> None:
    assert make_preference(row, DS) == PreferenceExample("", (("user", "What is 2+2?"),), "4", "5")


def test_a_multi_turn_conversation_keeps_its_shared_turns_as_the_prompt() -> None:
    shared = [{"role": "system", "content": "Be brief."}, _user("Hi"), _assistant("Hello"), _user("2+2?")]
    pair = make_preference({"chosen": [*shared, _assistant("4")], "rejected": [*shared, _assistant("22")]}, DS)
    assert pair.turns == (("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "2+2?"))
    assert (pair.chosen, pair.rejected) == ("4", "22")


def test_field_mapping_system_prompt_and_raw_text() -> None:
    ds = DatasetConfig(path="p.jsonl", field_mapping={"prompt": "question", "chosen": "good", "rejected": "bad"},
                       system_prompt="Solve it.", use_chat_template=False)  # fmt: skip
    pair = make_preference({"question": "2+2?", "good": "4", "bad": "5"}, ds)
    assert pair == PreferenceExample("Solve it.\n\n2+2?", None, "4", "5")


@pytest.mark.parametrize(
    ("row", "reason", "detail"),
    [
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, "identical_responses", "'same'"),
        ({"prompt": "q", "chosen": "a"}, "missing_field", "'rejected'"),
        ({"prompt": "q", "chosen": " ", "rejected": "b"}, "empty_field", "'chosen'"),
        ({"prompt": "", "chosen": "a", "rejected": "b"}, "empty_field", "'prompt'"),
        ({"prompt": "q", "chosen": 4, "rejected": "b"}, "wrong_type", "got int"),
        ({"prompt": "q", "chosen": [_user("x")], "rejected": "b"}, "wrong_type", "non-assistant"),
        ({"prompt": [_user("q"), _assistant("a")], "chosen": "a", "rejected": "b"}, "wrong_type", "ends with"),
        ({"chosen": "a", "rejected": "b"}, "missing_field", "no prompt column"),
        (
            {"chosen": [_user("q"), _assistant("a")], "rejected": [_user("other"), _assistant("b")]},
            "no_shared_prompt",
            "differ",
        ),
        ({"chosen": [_user("q"), _assistant("a")], "rejected": [_user("q")]}, "no_assistant_turn", "'rejected'"),
        ({"chosen": [_assistant("a")], "rejected": [_assistant("b")]}, "no_shared_prompt", "differ"),
        ({"prompt": [{"role": "tool", "content": "x"}], "chosen": "a", "rejected": "b"}, "unknown_role", "'tool'"),
    ],
)
def test_a_row_that_cannot_be_a_pair_is_rejected_with_its_reason(row: dict[str, Any], reason: str, detail: str) -> None:
    with pytest.raises(BadRowError) as caught:
        make_preference(row, DS)
    assert caught.value.reason == reason and detail in caught.value.detail


def _trained(tokenizer: Any, labels: list[int]) -> str:
    return str(tokenizer.decode([t for t in labels if t != IGNORE_INDEX]))


def test_each_side_trains_on_its_response_alone_after_the_same_prompt(tokenizer: Any) -> None:
    pair = make_preference({"prompt": "What is two plus two?", "chosen": "four", "rejected": "five"}, DS)
    tokens = tokenize_preference(pair, TextTokenizer.from_hf(tokenizer), max_seq_length=256, max_prompt_length=128)
    assert not tokens.truncated
    assert _trained(tokenizer, tokens.chosen_labels).startswith("four")
    assert _trained(tokenizer, tokens.rejected_labels).startswith("five")
    prompt = tokens.chosen_labels.index(next(t for t in tokens.chosen_labels if t != IGNORE_INDEX))
    assert tokens.chosen_ids[:prompt] == tokens.rejected_ids[:prompt]
    assert "What is two plus two?" in tokenizer.decode(tokens.chosen_ids[:prompt])


def test_truncation_keeps_the_prompts_end_then_cuts_the_responses(tokenizer: Any) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(60)) + " QUESTION-END"
    pair = make_preference({"prompt": long_prompt, "chosen": "the right answer " * 8, "rejected": "no"}, DS)
    tokens = tokenize_preference(pair, TextTokenizer.from_hf(tokenizer), max_seq_length=64, max_prompt_length=24)
    assert tokens.truncated and tokens.length > 64
    assert len(tokens.chosen_ids) <= 64 and len(tokens.rejected_ids) <= 64
    assert "QUESTION-END" in tokenizer.decode(tokens.chosen_ids) and "word0 " not in tokenizer.decode(tokens.chosen_ids)
    assert _trained(tokenizer, tokens.rejected_labels).startswith("no")


def test_fit_pair_prompt_first_then_responses() -> None:
    x = IGNORE_INDEX
    chosen = ([1, 2, 3, 4, 5, 6, 7, 8], [x, x, x, x, 5, 6, 7, 8])  # prompt 4, response 4
    rejected = ([1, 2, 3, 4, 9, 9], [x, x, x, x, 9, 9])  # prompt 4, response 2
    (c_ids, c_labels), (r_ids, _), cut = fit_pair(chosen, rejected, max_seq_length=6, max_prompt_length=1)
    assert cut and c_ids == [3, 4, 5, 6, 7, 8] and c_labels[:2] == [x, x] and r_ids == [3, 4, 9, 9]
    (c_ids, _), (r_ids, _), _ = fit_pair(chosen, rejected, max_seq_length=6, max_prompt_length=3)
    assert c_ids == [2, 3, 4, 5, 6, 7] and r_ids == [2, 3, 4, 9, 9]  # the prompt keeps 3; responses cut
    assert fit_pair(chosen, rejected, 8, 4) == (chosen, rejected, False)


def test_a_response_cut_to_nothing_is_rejected(tokenizer: Any) -> None:
    pair = make_preference({"prompt": " ".join(["long"] * 80), "chosen": "a", "rejected": "b"}, DS)
    with pytest.raises(BadRowError) as caught:
        tokenize_preference(pair, TextTokenizer.from_hf(tokenizer), max_seq_length=16, max_prompt_length=16)
    assert caught.value.reason == "all_labels_masked"


@pytest.mark.parametrize("overlong", ["error", "drop"])
def test_an_overlong_pair_is_refused_for_its_length_unless_truncating(tokenizer: Any, overlong: str) -> None:
    # The pair whose response truncation would mask: with overlong error or drop it is over_length, never
    # counted as all_labels_masked (which hid that it was refused for its length).
    pair = make_preference({"prompt": " ".join(["long"] * 80), "chosen": "a", "rejected": "b"}, DS)
    with pytest.raises(BadRowError, match=r"\d+ tokens > max_seq_length 16$") as caught:
        tokenize_preference(pair, TextTokenizer.from_hf(tokenizer), max_seq_length=16, max_prompt_length=16,
                            overlong=overlong)  # fmt: skip
    assert caught.value.reason == "over_length"
