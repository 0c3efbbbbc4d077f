"""Preparation's row-by-row reader: every kind of bad row is rejected on its own, with its file, line
and reason (never by refusing the file), the counts add up, and files are read a line at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from rayft.config import DatasetConfig, load_config
from rayft.data.formats import UNREADABLE_COLUMN
from rayft.data.prepare import prepare_data
from rayft.data.read.rows import iter_json_lines, read_rows
from rayft.errors import DataError


def _good(i: int) -> bytes:
    return json.dumps({"prompt": f"What is {i}+1?", "completion": str(i + 1)}).encode() + b"\n"


# Line by line: what is on it, and the reason its row is rejected ("" when it is accepted).
CORPUS: list[tuple[bytes, str]] = [
    (b"\xef\xbb\xbf" + _good(0), ""),  # a byte order mark opening the file is dropped
    (_good(1), ""),
    (b'{"prompt": "Half a row", \n', "bad_json"),
    (b'{"prompt": ["a", "list"], "completion": "2"}\n', "wrong_type"),
    (b'{"prompt": "A number for an answer", "completion": 7}\n', "wrong_type"),
    (b'{"prompt": "caf\xe9", "completion": "Latin-1"}\n', "bad_encoding"),
    (b'{"prompt": "No completion"}\n', "missing_field"),
    (b'{"prompt": "Blank completion", "completion": "  "}\n', "empty_field"),
    (b"\n", "blank"),  # a blank line is no row at all
    (b"[1, 2]\n", "bad_json"),
    (b'{"prompt": "Twice", "completion": "a", "completion": "b"}\n', "duplicate_key"),
    *[(_good(i), "") for i in range(2, 14)],
]


def _write_corpus(path: Path) -> None:
    path.write_bytes(b"".join(line for line, _ in CORPUS))


def _expected_rejects() -> list[tuple[int, str]]:
    return [(number, reason) for number, (_, reason) in enumerate(CORPUS, start=1) if reason not in ("", "blank")]


def test_every_bad_line_is_kept_as_a_row_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    _write_corpus(path)
    rows = read_rows(DatasetConfig(path=str(path)))
    lines = [rows.origins.at(i) for i in range(len(rows.rows))]
    assert lines == [(str(path), n) for n, (_, kind) in enumerate(CORPUS, start=1) if kind != "blank"]
    unreadable = [(line, json.loads(text)[UNREADABLE_COLUMN]) for (_, line), text in zip(lines, rows.rows, strict=True)
                  if UNREADABLE_COLUMN in text]  # fmt: skip
    assert [(line, reason) for line, (reason, _) in unreadable] == [(3, "bad_json"), (6, "bad_encoding"),
                                                                   (10, "bad_json"), (11, "duplicate_key")]  # fmt: skip
    assert unreadable[1][1][1] == "not UTF-8: byte 0xe9 at offset 15 of the line (invalid continuation byte)"
    assert json.loads(rows.rows[0]) == {"prompt": "What is 0+1?", "completion": "1"}  # no BOM left
    assert rows.text_columns() == {"prompt", "completion"}


def test_the_corpus_is_rejected_row_by_row_and_the_counts_add_up(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    _write_corpus(path)
    cfg = load_config(None, [f"model.name={tiny_model_dir}", f"data.datasets=[{{path: '{path}'}}]",
                             "data.validation_fraction=0", "data.max_rejected_fraction=0.5"])  # fmt: skip
    prepared = prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "report", use_ray=False)
    report = [json.loads(line) for line in (tmp_path / "report" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["line"], r["reason"]) for r in report) == _expected_rejects()
    assert {r["file"] for r in report} == {str(path)}
    by_line = {r["line"]: r for r in report}
    assert by_line[4]["detail"] == "field 'prompt' (column 'prompt') is a list, not text"
    assert (
        by_line[5]["detail"]
        == "field 'completion' (column 'completion') is the number 7 where the other rows hold text"
    )
    rows_in = sum(1 for _, kind in CORPUS if kind != "blank")
    stats = prepared.stats
    assert stats["rows_total"] == rows_in == 22
    assert stats["rejected_total"] == len(report) == 8
    assert prepared.train.num_examples + stats["rejected_total"] == rows_in
    assert stats["rejected_by_reason"] == {"bad_json": 2, "wrong_type": 2, "bad_encoding": 1, "missing_field": 1,
                                           "empty_field": 1, "duplicate_key": 1}  # fmt: skip


def test_a_number_column_stays_text_when_most_rows_hold_numbers(tmp_path: Path) -> None:
    path = tmp_path / "numbers.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": i}) + "\n" for i in range(5)))
    assert read_rows(DatasetConfig(path=str(path))).text_columns() == {"question"}


def _prepare_cli(config: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rayft", "data", "prepare", str(config), "--in-process"]
    return subprocess.run(command, capture_output=True, text=True, env=os.environ, timeout=300, check=False)


def test_rayft_data_prepare_reports_the_corpus_or_stops_on_the_threshold(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "corpus.jsonl"
    _write_corpus(data)

    def config(fraction: float) -> Path:
        path = tmp_path / f"cfg-{fraction}.yaml"
        path.write_text(
            f"name: prep-{fraction}\nstorage_path: {tmp_path / 'runs'}\nmodel:\n  name: {tiny_model_dir}\n"
            f"data:\n  datasets:\n    - path: {data}\n  max_rejected_fraction: {fraction}\n"
            f"  validation_fraction: 0\n  cache_dir: {tmp_path / 'cache'}\n"
        )
        return path

    lenient = _prepare_cli(config(0.5))
    assert lenient.returncode == 0, lenient.stderr
    assert "22 read, 22 train, 0 validation" in lenient.stdout and "rejected:   8\n" in lenient.stdout
    report = tmp_path / "runs" / "prep-0.5" / "data" / "rejected.jsonl"
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert sorted((r["line"], r["reason"]) for r in entries) == _expected_rejects()

    strict = _prepare_cli(config(0.1))
    assert strict.returncode == 2
    assert "Traceback" not in strict.stderr
    assert "Error: data: 8 of 22 rows (36.4%) were rejected, more than data.max_rejected_fraction=0.1" in strict.stderr


def test_max_rows_counts_bad_rows_and_stops_reading(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    _write_corpus(path)
    rows = read_rows(DatasetConfig(path=str(path), max_rows=4))
    assert len(rows.rows) == 4 and rows.unreadable == 1


def test_a_dataset_without_one_readable_row_is_refused_naming_the_first(tmp_path: Path) -> None:
    from rayft.config.data import DataConfig
    from rayft.data.read.rows import read_sources

    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"none of its 1 rows can be read \(.*latin1.jsonl line 1: bad_encoding"):
        read_sources(DataConfig(datasets=[DatasetConfig(path=str(path))]))


def test_auto_format_passes_over_a_column_empty_in_every_row(tmp_path: Path) -> None:
    # A symbolic SDG output: an unused `prompt` column, empty in every row, beside the filled question/answer.
    from rayft.config.data import DataConfig
    from rayft.data.read.rows import read_sources

    path = tmp_path / "sdg.jsonl"
    rows = [{"question": f"q{i}", "answer": f"a{i}", "prompt": "", "model": None, "tools": []} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (source,) = read_sources(DataConfig(datasets=[DatasetConfig(path=str(path))]))
    assert source.format.format == "prompt_completion"
    assert source.format.columns == {"prompt": "question", "completion": "answer"}


def test_auto_format_keeps_a_prompt_column_filled_in_some_row(tmp_path: Path) -> None:
    from rayft.config.data import DataConfig
    from rayft.data.read.rows import read_sources

    path = tmp_path / "mixed.jsonl"
    rows = [{"question": "q", "answer": "a", "prompt": ""}, {"question": "q", "answer": "a", "prompt": "p"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (source,) = read_sources(DataConfig(datasets=[DatasetConfig(path=str(path))]))
    assert source.format.columns == {"prompt": "prompt", "completion": "answer"}


def test_parquet_and_csv_rows_know_their_file_and_number(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pa.table({"text": [f"t{i}" for i in range(10)]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=3)
    rows = read_rows(DatasetConfig(path=str(tmp_path / "a.parquet"), max_rows=7))
    assert [rows.origins.at(i)[1] for i in range(len(rows.rows))] == list(range(1, 8))
    pacsv.write_csv(table, tmp_path / "b.csv")
    rows = read_rows(DatasetConfig(path=str(tmp_path / "b.csv")))
    assert rows.origins.at(0) == (str(tmp_path / "b.csv"), 2)  # line 1 is the header
    assert [json.loads(r)["text"] for r in rows.rows] == [f"t{i}" for i in range(10)]


def test_json_lines_are_read_one_line_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as file:
        for i in range(50_000):
            file.write(_good(i))
    assert path.stat().st_size > 2_000_000
    tracemalloc.start()
    try:
        count = sum(1 for line in iter_json_lines(path) if line.row is not None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    assert peak < 200_000  # a few lines and the file's read buffer, never the file (> 2 MB)


def test_a_row_store_reads_back_by_index_slice_and_iteration(tmp_path: Path) -> None:
    from rayft.data.read import rows as rows_module

    store = rows_module.RowStore(tmp_path)
    texts = [json.dumps({"n": n}) for n in range(rows_module.BATCH_ROWS + 5)]  # two batches in the file
    for text in texts:
        store.append(text)
    assert len(store) == len(texts)
    assert store[0] == texts[0] and store[-1] == texts[-1]
    assert store[:3] == texts[:3]
    assert (
        store[rows_module.BATCH_ROWS - 1 : rows_module.BATCH_ROWS + 2]
        == texts[rows_module.BATCH_ROWS - 1 : rows_module.BATCH_ROWS + 2]
    )
    assert store[::1000] == texts[::1000] and store[5:2] == []
    assert list(store) == texts
