from __future__ import annotations

from pathlib import Path

from rayft.data.builtin import load_builtin
from rayft.testing.sql_t5 import build_sql_tokenizer


def test_sql_tokenizer_splits_digits_and_round_trips_queries(tmp_path: Path) -> None:
    """Numbers are single digits (copied one by one from question to query) and decoding gives the
    query back character for character, so it runs as written."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_sql_tokenizer(tmp_path, rows=300))
    assert tokenizer.tokenize("salary < 60322")[-5:] == ["6", "0", "3", "2", "2"]
    for row in load_builtin("builtin:sql", "test", 50):
        for text in (row["input"], row["output"]):
            ids = tokenizer(text).input_ids
            assert tokenizer.unk_token_id not in ids
            assert tokenizer.decode(ids, skip_special_tokens=True) == text
