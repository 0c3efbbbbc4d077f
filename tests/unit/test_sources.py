"""Reading datasets with the one reader: built-in splits, local files of every type, URIs, and bad rows and
bad datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import DatasetConfig
from rayft.data.read.rows import iter_rows
from rayft.errors import DataError


def rows_of(ds: DatasetConfig) -> list[dict[str, object] | None]:
    """Every row of ``ds`` as read (None for one that could not be)."""
    return [item.row for item in iter_rows(ds)]


def test_builtin_splits_are_disjoint_and_deterministic() -> None:
    train = rows_of(DatasetConfig(path="builtin:arithmetic", max_rows=300))
    test = rows_of(DatasetConfig(path="builtin:arithmetic", split="test", max_rows=100))
    assert len(train) == 300 and len(test) == 100
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    again = rows_of(DatasetConfig(path="builtin:arithmetic", max_rows=300))
    assert again == train
    assert all(r["answer"].splitlines()[-1].startswith("#### ") for r in train)


def test_builtin_sets_are_pinned_by_golden_examples() -> None:
    # Golden values of seed 0: the words and schemas live in rayft/data/builtin/*.yaml, and an edit there
    # changes the sets that results in docs/ were measured on; change these values only with those results.
    from rayft.data.builtin.arithmetic import iter_arithmetic_problems
    from rayft.data.builtin.sql import iter_sql_examples

    problems = [(r["question"][:40], r["answer"].splitlines()[-1]) for r in iter_arithmetic_problems(4, seed=0)]
    assert problems == [
        ("Hana collects 38 marbles in the first we", "#### 74"),
        ("Hana collects 66 stamps in the first wee", "#### 111"),
        ("Priya works 6 hours at the library and e", "#### 29"),
        ("Jonas buys 4 boxes of stamps with 7 stam", "#### 26"),
    ]
    assert [r["output"] for r in iter_sql_examples(3, seed=0)] == [
        "SELECT MAX(year) FROM films WHERE director = 'Bruno'",
        "SELECT MAX(founded) FROM cities WHERE city = 'Elbury' AND country = 'Estmark' AND area > 179.0",
        "SELECT MIN(price) FROM products WHERE rating > 3.5",
    ]


def test_unknown_builtin_and_split_are_named() -> None:
    with pytest.raises(DataError, match="builtin:arithmetic"):
        rows_of(DatasetConfig(path="builtin:nope"))
    with pytest.raises(DataError, match="'validation' does not exist"):
        rows_of(DatasetConfig(path="builtin:arithmetic", split="validation"))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_local_file_types(tmp_path: Path, suffix: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(5)]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        pacsv.write_csv(pa.Table.from_pylist(rows), path)
    assert rows_of(DatasetConfig(path=str(path), max_rows=3)) == rows[:3]


def test_directory_of_jsonl_files(tmp_path: Path) -> None:
    for part in range(2):
        (tmp_path / f"part-{part}.jsonl").write_text(json.dumps({"text": f"t{part}"}) + "\n")
    items = list(iter_rows(DatasetConfig(path=str(tmp_path))))
    assert [(i.file, i.line, i.row) for i in items] == [
        (str(tmp_path / f"part-{part}.jsonl"), 1, {"text": f"t{part}"}) for part in range(2)
    ]


def test_bad_json_lines_are_rejected_rows_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": \n[1, 2]\n{"a": 2, "a": 3}\n')
    items = list(iter_rows(DatasetConfig(path=str(path))))
    assert [(i.line, i.row, i.reason) for i in items] == [
        (1, {"a": 1}, ""),
        (2, None, "bad_json"),
        (3, None, "bad_json"),
        (4, None, "duplicate_key"),
    ]
    assert items[2].detail == "a list, not an object" and items[1].text == '{"a":'  # the bad line, for its report


def test_a_missing_file_is_refused_and_rows_of_mixed_types_are_read_as_they_are(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        rows_of(DatasetConfig(path=str(tmp_path / "absent.jsonl")))
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"answer": "7"}\n{"answer": {"x": 1}}\n')
    assert rows_of(DatasetConfig(path=str(path))) == [{"answer": "7"}, {"answer": {"x": 1}}]  # checked later


def test_a_stage_path_is_refused_with_the_fix() -> None:
    with pytest.raises(DataError, match=r"output of a pipeline stage; run the config with `rayft run`"):
        rows_of(DatasetConfig(path="stage:sdg"))


def test_source_files_become_text_rows_and_bad_encodings_are_kept_for_the_report(tmp_path: Path) -> None:
    from rayft.data.formats import BadRowError, make_example, resolve_format

    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.rs").write_text("fn main() {}\n")
    (tmp_path / "pkg" / "sub" / "b.rs").write_bytes(b'let s = "caf\xe9";\n')  # Latin-1, not UTF-8
    (tmp_path / "pkg" / "notes.txt").write_text("not matched\n")
    (tmp_path / "pkg" / ".git").mkdir()
    (tmp_path / "pkg" / ".git" / "c.rs").write_text("hidden\n")
    ds = DatasetConfig(path=str(tmp_path / "pkg"), files="**/*.rs", format="text")
    rows = [r for r in rows_of(ds) if r is not None]
    assert [(r["path"], r["text"]) for r in rows] == [("a.rs", "fn main() {}\n"), ("sub/b.rs", None)]
    assert rows[1]["encoding_error"] == "not UTF-8: byte 0xe9 at offset 12 (invalid continuation byte)"
    fmt = resolve_format(ds, list(rows[0]))
    assert make_example(rows[0], ds, fmt).response == "fn main() {}\n"
    with pytest.raises(BadRowError, match=r"bad_encoding: sub/b.rs: not UTF-8: byte 0xe9"):
        make_example(rows[1], ds, fmt)


def test_source_files_are_chunked_at_line_ends(tmp_path: Path) -> None:
    from rayft.data.read.sources import chunk_text

    text = "one\ntwo\nthree\n" + "x" * 25 + "\nend"
    pieces = chunk_text(text, 10)
    assert "".join(pieces) == text and all(len(p) <= 10 for p in pieces)
    assert pieces[:2] == ["one\ntwo\n", "three\n"]
    (tmp_path / "m.py").write_text(text)
    rows = [r for r in rows_of(DatasetConfig(path=str(tmp_path), files="*.py", chunk_chars=10)) if r is not None]
    assert [r["chunk"] for r in rows] == list(range(len(pieces))) and {r["path"] for r in rows} == {"m.py"}


def test_source_files_errors_name_the_glob_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no file matches files='\*\*/\*.rs'.*fix the glob"):
        rows_of(DatasetConfig(path=str(tmp_path), files="**/*.rs"))
    with pytest.raises(DataError, match=r"needs path to be a local directory"):
        rows_of(DatasetConfig(path=str(tmp_path / "missing"), files="*.py"))
    with pytest.raises(ValueError, match=r"chunk_chars=10 is set without files"):
        DatasetConfig(path=str(tmp_path), chunk_chars=10)


def test_a_uri_dataset_is_read_a_batch_at_a_time_with_rows_numbered_and_cut_at_max_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"row {i} " + "x" * 200} for i in range(40_000)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2_000)
    size = pa.Table.from_pylist(rows).nbytes
    del rows
    uri = path.as_uri()
    before = pa.total_allocated_bytes()
    peak = 0
    count = 0
    for item in iter_rows(DatasetConfig(path=uri)):
        assert item.row is not None and item.row["text"].startswith(f"row {count} ")
        assert (item.file, item.line) == (uri, count + 1)
        count += 1
        if count % 1_000 == 0:
            peak = max(peak, pa.total_allocated_bytes() - before)
    assert count == 40_000
    # The whole table is about 8.6 MB; a batch of 4,096 rows is under 1 MB, and the reader holds about
    # 2.4 MB (the batch and the row groups it spans). A scanner that reads the file ahead holds 9.9 MB.
    assert peak < size / 3, (peak, size)
    assert [r.line for r in iter_rows(DatasetConfig(path=uri, max_rows=5))] == [1, 2, 3, 4, 5]


def test_an_unreadable_uri_is_one_data_error_naming_it(tmp_path: Path) -> None:
    uri = (tmp_path / "absent.parquet").as_uri()
    with pytest.raises(DataError, match=r"cannot read it with pyarrow .*check the URI"):
        next(iter_rows(DatasetConfig(path=uri)))


def test_a_bad_line_of_a_json_lines_uri_is_one_rejected_row_not_a_refused_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "one"}\nnot json\n\n{"text": "caf\xe9"}\n{"text": "four"}\n')
    items = list(iter_rows(DatasetConfig(path=path.as_uri())))
    assert [(i.file, i.line, i.reason) for i in items] == [
        (path.as_uri(), 1, ""),
        (path.as_uri(), 2, "bad_json"),
        (path.as_uri(), 4, "bad_encoding"),
        (path.as_uri(), 5, ""),
    ]
    assert [i.row for i in items if i.row is not None] == [{"text": "one"}, {"text": "four"}]
