"""Every dataset format rendered and tokenized with the tiny ChatML tokenizer, `auto` detection,
and every bad-row reason; labels are checked by decoding exactly the trained tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rayft.config.data import DatasetConfig
from rayft.data.formats import detect_format, resolve_format
from rayft.data.prepared import IGNORE_INDEX
from rayft.data.tokenize import TextTokenizer, TokenizeJob, tokenize_rows
from rayft.errors import DataError


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from rayft.config import ModelConfig
    from rayft.models.loading import load_tokenizer

    return load_tokenizer(ModelConfig(name=str(tiny_model_dir)))


def _run(tokenizer: Any, ds: DatasetConfig, rows: list[dict[str, Any]], **settings: Any) -> list[dict[str, Any]]:
    """Tokenize rows as the preparation step does; one dict per row."""
    fmt = resolve_format(ds, sorted({k for r in rows for k in r}))
    options = {"max_seq_length": 512, "overlong": "truncate", "train_on_prompt": False, **settings}
    job = TokenizeJob(TextTokenizer.from_hf(tokenizer), ((ds, fmt),), **options)
    out = tokenize_rows(job, list(range(len(rows))), [0] * len(rows), [json.dumps(r) for r in rows])
    return [dict(zip(out, values, strict=True)) for values in zip(*out.values(), strict=True)]


def _text(tokenizer: Any, row: dict[str, Any]) -> tuple[str, str]:
    """(the whole decoded text, the decoded trained tokens)."""
    trained = [t for t in row["labels"] if t != IGNORE_INDEX]
    return tokenizer.decode(row["input_ids"]), tokenizer.decode(trained)


def test_light_tokenizer_renders_and_encodes_as_transformers_does(tokenizer: Any) -> None:
    light = TextTokenizer.from_hf(tokenizer)
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "2"},
    ]
    for messages, prompt in ((chat, False), (chat[:2], True)):
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        assert light.chat_text(messages, generation_prompt=prompt) == expected
    text = "<|im_start|>user\nThe quick brown fox<|im_end|>\n"
    encoded = tokenizer([text], add_special_tokens=False, return_offsets_mapping=True)
    assert light.encode([text]) == ([encoded["input_ids"][0]], [[tuple(o) for o in encoded["offset_mapping"][0]]])


def test_a_tokenizer_saved_after_a_padded_call_still_encodes_rows_unpadded(tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rayft.export.verify import probe_batch

    texts = ["a", "the quick brown fox jumps"]
    unpadded = TextTokenizer.from_hf(tokenizer).encode(texts)[0]
    probe_batch(tokenizer, ["hi", "a longer prompt than the first"])  # export's verification pads, left
    tokenizer.save_pretrained(tmp_path)  # and then saves the tokenizer beside the export
    assert json.loads((tmp_path / "tokenizer.json").read_text())["padding"] is None
    padded = AutoTokenizer.from_pretrained(tmp_path)
    padded.backend_tokenizer.enable_padding(direction="left", pad_id=0)  # as a file saved by another tool may be
    padded.backend_tokenizer.enable_truncation(2)
    assert TextTokenizer.from_hf(padded).encode(texts)[0] == unpadded
    assert padded.backend_tokenizer.padding is not None  # the caller's tokenizer is left as it was


def test_template_without_chat_template_trains_the_response_and_eos(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="template", input_template="Question: {q}\nAnswer: ",
                       output_template="{a}", field_mapping={"q": "question", "a": "answer"},
                       use_chat_template=False)  # fmt: skip
    (row,) = _run(tokenizer, ds, [{"question": "2+2?", "answer": "4 #### 4"}])
    text, trained = _text(tokenizer, row)
    assert text == "Question: 2+2?\nAnswer: 4 #### 4<|im_end|>"
    assert trained.strip() == "4 #### 4<|im_end|>" and row["reason"] == ""


def test_template_with_chat_template_is_a_user_and_an_assistant_turn(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="template", input_template="Q: {question}", output_template="A: {answer}",
                       system_prompt="Be brief.")  # fmt: skip
    (row,) = _run(tokenizer, ds, [{"question": "2+2?", "answer": "4"}])
    text, trained = _text(tokenizer, row)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: 2+2?<|im_end|>\n"
        "<|im_start|>assistant\nA: 4<|im_end|>\n"
    )
    assert trained == "A: 4<|im_end|>\n"


def test_alpaca_with_and_without_input(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="alpaca", use_chat_template=False)
    rows = [
        {"instruction": "Add", "input": "2 and 3", "output": "5"},
        {"instruction": "Say hi", "input": "", "output": "hi"},
    ]
    with_input, without = _run(tokenizer, ds, rows)
    assert _text(tokenizer, with_input) == (
        "### Instruction:\nAdd\n\n### Input:\n2 and 3\n\n### Response:\n5<|im_end|>",
        "5<|im_end|>",
    )
    assert _text(tokenizer, without)[0] == "### Instruction:\nSay hi\n\n### Response:\nhi<|im_end|>"
    chat = _run(tokenizer, ds.model_copy(update={"use_chat_template": True}), rows[:1])[0]
    assert "<|im_start|>user\nAdd\n\n2 and 3<|im_end|>" in _text(tokenizer, chat)[0]


def test_messages_train_every_assistant_turn_only(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="messages", system_prompt="You add.")
    turns = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
    ]
    (row,) = _run(tokenizer, ds, [{"messages": turns}])
    text, trained = _text(tokenizer, row)
    assert text.startswith("<|im_start|>system\nYou add.<|im_end|>\n<|im_start|>user\n1+1")
    assert trained == "2<|im_end|>\n4<|im_end|>\n"


def test_sharegpt_turns_are_detected_and_mapped(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl")
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    fmt = resolve_format(ds, ["conversations"])
    assert fmt.format == "messages" and fmt.columns == {"messages": "conversations"} and fmt.detected
    (row,) = _run(tokenizer, ds, [{"conversations": conv}])
    text, trained = _text(tokenizer, row)
    assert "<|im_start|>system\nS<|im_end|>" in text and trained == "hello<|im_end|>\n"


def test_prompt_completion_and_train_on_prompt(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="prompt_completion", use_chat_template=False)
    (row,) = _run(tokenizer, ds, [{"prompt": "The answer is ", "completion": "42"}])
    # The prompt's trailing space merges into the token " 42", which overlaps the response: trained.
    assert _text(tokenizer, row) == ("The answer is 42<|im_end|>", " 42<|im_end|>")
    (everything,) = _run(tokenizer, ds, [{"prompt": "The answer is ", "completion": "42"}], train_on_prompt=True)
    # Every token is trained but the first, which no position predicts.
    assert everything["labels"][0] == IGNORE_INDEX and everything["labels"][1:] == everything["input_ids"][1:]


def test_text_trains_every_token(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl")
    assert resolve_format(ds, ["text", "id"]).format == "text"
    (row,) = _run(tokenizer, ds, [{"text": "The quick brown fox", "id": 1}])
    assert row["labels"][1:] == row["input_ids"][1:] and row["labels"][0] == IGNORE_INDEX
    assert tokenizer.decode(row["input_ids"]) == "The quick brown fox<|im_end|>"


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        (["messages"], "messages"),
        (["instruction", "input", "output"], "alpaca"),
        (["prompt", "completion"], "prompt_completion"),
        (["question", "answer"], "prompt_completion"),
        (["text"], "text"),
    ],
)
def test_auto_detection(columns: list[str], expected: str) -> None:
    assert detect_format(columns, {}) == expected


def test_auto_detection_passes_over_empty_columns() -> None:
    ds = DatasetConfig(path="x.jsonl")
    columns = ["messages", "question", "answer", "prompt"]
    # An empty messages column and an empty prompt: the filled question/answer decide.
    fmt = resolve_format(ds, columns, empty={"messages", "prompt"})
    assert (fmt.format, fmt.columns) == ("prompt_completion", {"prompt": "question", "completion": "answer"})
    assert resolve_format(ds, columns).format == "messages"  # nothing said empty: the columns alone decide
    # Only empty columns fit a format: detection falls back to every column (the rows then say what is wrong).
    assert resolve_format(ds, ["text", "id"], empty={"text"}).format == "text"


def test_undetectable_columns_and_missing_columns_are_config_errors() -> None:
    with pytest.raises(DataError, match=r"cannot detect the dataset format from the columns \['a', 'b'\]"):
        resolve_format(DatasetConfig(path="x.jsonl"), ["a", "b"])
    with pytest.raises(DataError, match=r"column\(s\) \['output'\] not found.*field_mapping"):
        resolve_format(DatasetConfig(path="x.jsonl", format="alpaca"), ["instruction"])


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": "p", "completion": None}, "missing_field"),
        ({"prompt": "p", "completion": "   "}, "empty_field"),
        ({"prompt": "p", "completion": ["a", "b"]}, "wrong_type"),
    ],
)
def test_bad_prompt_completion_rows(tokenizer: Any, row: dict[str, Any], reason: str) -> None:
    ds = DatasetConfig(path="x.jsonl", format="prompt_completion")
    (out,) = _run(tokenizer, ds, [row])
    assert out["reason"] == reason and out["input_ids"] == [] and "completion" in out["detail"]


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([{"role": "user", "content": "hi"}], "no_assistant_turn"),
        ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}], "unknown_role"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "empty_field"),
        ([{"role": "user"}, {"role": "assistant", "content": "x"}], "missing_field"),
        ("not a list", "wrong_type"),
        ([], "empty_field"),
    ],
)
def test_bad_conversations(tokenizer: Any, messages: Any, reason: str) -> None:
    (out,) = _run(tokenizer, DatasetConfig(path="x.jsonl", format="messages"), [{"messages": messages}])
    assert out["reason"] == reason, out["detail"]


def test_overlong_rows_truncate_drop_or_mask_everything(tokenizer: Any) -> None:
    ds = DatasetConfig(path="x.jsonl", format="prompt_completion", use_chat_template=False)
    long_answer = {"prompt": "Q ", "completion": "seven " * 40}
    long_prompt = {"prompt": "seven " * 40, "completion": "4"}
    truncated, masked = _run(tokenizer, ds, [long_answer, long_prompt], max_seq_length=16)
    assert truncated["reason"] == "" and truncated["truncated"] and len(truncated["input_ids"]) == 16
    assert masked["reason"] == "all_labels_masked" and "truncated from" in masked["detail"]
    (dropped,) = _run(tokenizer, ds, [long_answer], max_seq_length=16, overlong="drop")
    assert dropped["reason"] == "over_length" and "> max_seq_length 16" in dropped["detail"]
    (flagged,) = _run(tokenizer, ds, [long_answer], max_seq_length=16, overlong="error")
    assert flagged["reason"] == "over_length"  # the preparation step turns it into a DataError


def test_overlong_error_stops_preparation_naming_the_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rayft.config import load_config
    from rayft.data.prepare import prepare_data

    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "Q", "completion": "seven " * 40}) + "\n")
    cfg = load_config(None, [f"model.name={tiny_model_dir}", f"data.datasets=[{{path: '{path}'}}]",
                             "data.max_seq_length=16", "data.overlong=error"])  # fmt: skip
    with pytest.raises(DataError, match=r"dataset 'long.jsonl' row 0: \d+ tokens > max_seq_length 16"):
        prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)


def test_a_job_is_keyed_by_its_content_so_workers_reuse_its_tokenizer(tokenizer: Any) -> None:
    from rayft.data.tokenize import job_key

    ds = DatasetConfig(path="qa.jsonl")
    fmt = resolve_format(ds, ["completion", "prompt"])

    def job(max_seq_length: int) -> TokenizeJob:
        return TokenizeJob(TextTokenizer.from_hf(tokenizer), ((ds, fmt),), max_seq_length, "truncate", False)

    key = job_key(job(512))
    assert job_key(job(512)) == key  # a second preparation with the same tokenizer and settings
    assert job_key(job(256)) != key
