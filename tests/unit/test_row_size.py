"""Bounded rows: a row larger than ``max_row_bytes`` is rejected on its own, with its file, line and
size, in every reader (JSON Lines, JSON lists, Parquet, CSV, ``rayft generate``'s input), and a
JSON Lines line is never held whole, so that one huge line cannot take a reader's memory."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayft.config import DatasetConfig, load_config
from rayft.data.formats import UNREADABLE_COLUMN
from rayft.data.prepare import prepare_data
from rayft.data.read.rows import read_rows
from rayft.errors import DataError
from rayft.inference.prompts import RejectedRow, read_prompts
from rayft.lines import OversizedLine, bounded_lines
from tests.support.generation import json_lines


def _good(i: int) -> bytes:
    return json.dumps({"prompt": f"What is {i}+1?", "completion": str(i + 1)}).encode() + b"\n"


def _big(size: int) -> bytes:
    """A valid JSON row of about ``size`` bytes, with its newline."""
    return b'{"prompt": "' + b"x" * size + b'", "completion": "1"}\n'


def test_bounded_lines_reports_a_long_line_by_its_size_and_goes_on() -> None:
    stream = io.BytesIO(b"short\n" + b"y" * 25 + b"\n" + b"z" * 10 + b"\n" + b"w" * 11)
    assert list(bounded_lines(stream, 10)) == [b"short\n", OversizedLine(25), b"z" * 10 + b"\n", OversizedLine(11)]
    assert list(bounded_lines(io.BytesIO(b"a" * 10), 10)) == [b"a" * 10]  # at the bound, at the end of the file
    assert list(bounded_lines(io.BytesIO(b"a" * 30 + b"\r\nb\n"), 10)) == [OversizedLine(30), b"b\n"]


def _write_lines(path: Path, big_bytes: int) -> None:
    """Three good rows, an oversized one (line 4), then three good rows."""
    path.write_bytes(b"".join([_good(0), _good(1), _good(2), _big(big_bytes), _good(3), _good(4), _good(5)]))


def _unreadable(rows: object) -> list[tuple[int, str, str]]:
    out = []
    for i, text in enumerate(rows.rows):  # type: ignore[attr-defined]
        if UNREADABLE_COLUMN in text:
            reason, detail = json.loads(text)[UNREADABLE_COLUMN]
            out.append((rows.origins.at(i)[1], reason, detail))  # type: ignore[attr-defined]
    return out


def test_an_oversized_json_line_is_rejected_between_good_rows(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    _write_lines(path, 5000)
    rows = read_rows(DatasetConfig(path=str(path), max_row_bytes=4096))
    assert len(rows.rows) == 7
    [(line, reason, detail)] = _unreadable(rows)
    assert (line, reason) == (4, "row_too_large")
    assert detail == (
        "5,033 bytes (4.9 KiB), above max_row_bytes (4,096 bytes (4.0 KiB)); split the row or raise the "
        "dataset's max_row_bytes"
    )
    good = [json.loads(text)["completion"] for text in rows.rows if UNREADABLE_COLUMN not in text]
    assert good == ["1", "2", "3", "4", "5", "6"]


def test_json_list_parquet_and_csv_rows_over_the_bound_are_rejected_per_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    texts = ["short", "x" * 500, "also short"]
    (tmp_path / "a.json").write_text(json.dumps([{"text": t} for t in texts]))
    (tmp_path / "d.json").write_text(json.dumps({"version": 1, "data": [{"text": t} for t in texts]}))
    pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet")
    pacsv.write_csv(pa.table({"text": texts}), tmp_path / "c.csv")
    # Measured before parsing: the JSON item's text, the Parquet cell's bytes in Arrow, the CSV record (quoted).
    for name, line, size in (("a.json", 2, 512), ("b.parquet", 2, 500), ("c.csv", 3, 502), ("d.json", 2, 512)):
        rows = read_rows(DatasetConfig(path=str(tmp_path / name), max_row_bytes=200))
        [(at, reason, detail)] = _unreadable(rows)
        assert (at, reason) == (line, "row_too_large"), name
        assert detail.startswith(f"{size} bytes, above max_row_bytes (200 bytes)"), (name, detail)
        assert [json.loads(t)["text"] for t in rows.rows if UNREADABLE_COLUMN not in t] == ["short", "also short"]


def test_a_csv_row_longer_than_a_read_block_is_rejected_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text("text\nshort\n" + "x" * (3 << 20) + "\nshort\n")
    rows = read_rows(DatasetConfig(path=str(path), max_row_bytes=2 << 20))
    [(line, reason, detail)] = _unreadable(rows)
    assert (line, reason) == (3, "row_too_large")
    assert detail.startswith("3,145,728 bytes (3.0 MiB), above max_row_bytes (2,097,152 bytes (2.0 MiB))")
    assert len(rows.rows) == 3
    # A bound far below pyarrow's 1 MiB block: the record is cut out before pyarrow sees it, the file is read.
    rows = read_rows(DatasetConfig(path=str(path), max_row_bytes=100))
    assert [(at, reason) for at, reason, _ in _unreadable(rows)] == [(3, "row_too_large")]
    assert [json.loads(t)["text"] for t in rows.rows if UNREADABLE_COLUMN not in t] == ["short", "short"]


def test_csv_records_keep_quoted_line_ends_and_quotes_and_cut_oversized_ones_across_chunks() -> None:
    from rayft.data.read.records import CHUNK_BYTES, csv_records
    from rayft.lines import OversizedLine

    big = b'"' + b"y" * (CHUNK_BYTES + 10) + b'"'
    text = b'a,b\r\n1,"two\nlines, ""quoted"""\n' + big + b",3\n\n4,5"
    records = list(csv_records(io.BytesIO(text), 4096))
    assert records == [b"a,b\r\n", b'1,"two\nlines, ""quoted"""\n', OversizedLine(len(big) + 2), b"\n", b"4,5"]


def test_json_array_items_keep_nested_brackets_and_escapes_and_cut_oversized_ones_across_chunks() -> None:
    from rayft.data.read.records import CHUNK_BYTES, json_array_items
    from rayft.lines import OversizedLine

    big = json.dumps({"t": "z" * (CHUNK_BYTES + 10)}).encode()
    tricky = json.dumps({"a": [1, {"b": '],{"\\'}], "c": "\\"}).encode()
    text = b" \n[ " + tricky + b", " + big + b',\n{"d": 1} ]  '
    items = list(json_array_items(io.BytesIO(text), 4096))
    assert items == [tricky, OversizedLine(len(big)), b'{"d": 1}']
    assert json.loads(items[0]) == {"a": [1, {"b": '],{"\\'}], "c": "\\"}
    assert list(json_array_items(io.BytesIO(b"[]"), 10)) == []
    assert list(json_array_items(io.BytesIO(b'[{"open": 1}, {"x"'), 100)) == [b'{"open": 1}', b'{"x"']


def test_json_object_items_stream_the_one_list_and_skip_the_objects_other_values() -> None:
    from rayft.data.read.records import CHUNK_BYTES, json_object_items, json_object_lists

    big = json.dumps({"t": "z" * (CHUNK_BYTES + 10)}).encode()
    tricky = json.dumps({"a": [1, {"b": '],{"\\'}], "c": "\\"}).encode()
    note = json.dumps("y" * CHUNK_BYTES + ']}"[').encode()  # a value longer than a read, with brackets in it
    text = b'{"meta": {"rows": [9]}, "note": ' + note + b', "da\\"ta": [ ' + tricky + b", " + big + b', {"d": 1}]}\n'
    items = list(json_object_items(io.BytesIO(text), 4096))
    assert items == [tricky, OversizedLine(len(big)), b'{"d": 1}']
    assert json_object_lists(io.BytesIO(text)) == ['da\\"ta']  # only lists directly in the object count
    assert json_object_lists(io.BytesIO(b'{"data": [1], "more": []} ')) == ["data", "more"]
    assert json_object_lists(io.BytesIO(b'{"data": [1]')) is None  # left open
    # JSON Lines whose first row holds a list is not one object
    assert json_object_lists(io.BytesIO(b'{"messages": [1]}\n{"messages": [2]}\n')) is None
    assert list(json_object_items(io.BytesIO(b'{"data": [{"open": 1}, {"x"'), 100)) == [b'{"open": 1}', b'{"x"']


def test_a_json_object_of_rows_is_read_as_its_list_and_json_lines_under_a_json_name_stay_lines(
    tmp_path: Path,
) -> None:
    rows = [{"prompt": f"q{i}", "completion": str(i)} for i in range(3)]
    (tmp_path / "obj.json").write_text(json.dumps({"source": "x", "data": [*rows, 7]}, indent=2))
    read = read_rows(DatasetConfig(path=str(tmp_path / "obj.json")))
    assert [json.loads(t).get("prompt") for t in list(read.rows)[:3]] == ["q0", "q1", "q2"]
    assert _unreadable(read) == [(4, "bad_json", "item 4 is a int, not an object")]
    lines = tmp_path / "lines.json"
    lines.write_text("".join(json.dumps({"messages": [{"role": "user", "content": str(i)}]}) + "\n" for i in range(3)))
    assert len(read_rows(DatasetConfig(path=str(lines))).rows) == 3
    for body, found in (({"a": [1], "b": [2]}, "found 2: 'a', 'b'"), ({"a": 1}, "found 0")):
        (tmp_path / "bad.json").write_text(json.dumps(body))
        with pytest.raises(
            DataError, match=f"bad.json: a JSON object must hold exactly one list of rows \\({found}\\)"
        ):
            read_rows(DatasetConfig(path=str(tmp_path / "bad.json")))


def test_prepare_reports_and_counts_the_oversized_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    _write_lines(path, 5000)
    cfg = load_config(None, [f"model.name={tiny_model_dir}", f"data.datasets=[{{path: '{path}', max_row_bytes: 4096}}]",
                             "data.validation_fraction=0", "data.max_rejected_fraction=0.5"])  # fmt: skip
    prepared = prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "report", use_ray=False)
    [entry] = [json.loads(line) for line in (tmp_path / "report" / "rejected.jsonl").read_text().splitlines()]
    assert (entry["file"], entry["line"], entry["reason"]) == (str(path), 4, "row_too_large")
    assert "5,033 bytes" in entry["detail"]
    assert prepared.stats["rows_total"] == 7
    assert prepared.stats["rejected_by_reason"] == {"row_too_large": 1}
    assert prepared.train.num_examples == 6


def test_generate_rejects_an_oversized_input_line_with_its_number() -> None:
    lines = [b'{"prompt": "a"}\n', b'{"prompt": "' + b"x" * 5000 + b'"}\n', b'{"prompt": "b"}\n']
    parsed = read_prompts(json_lines(lines, max_row_bytes=4096, setting="inference.max_row_bytes"))
    assert [row.line for row in parsed.rows] == [1, 3]
    [rejected] = parsed.rejected
    assert isinstance(rejected, RejectedRow)
    assert (rejected.line, rejected.reason) == (2, "row_too_large")
    # 5,000 x + {"prompt": "..."} (14 bytes), the line end not counted
    assert rejected.detail.startswith("5,014 bytes (4.9 KiB), above inference.max_row_bytes (4,096 bytes")


# Reads the file given as argv[1] through each reader and prints, per reader, the growth of the peak
# resident memory (MiB) and what it found; the readers are imported (and warmed) before the baseline.
_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from rayft.config import DatasetConfig
    from rayft.data.read.rows import read_rows
    from rayft.inference.batch import count_lines, input_rows
    from rayft.inference.prompts import iter_prompts

    path = Path(sys.argv[1])
    if path.suffix == ".json":  # a JSON object of rows: only prepare's reader takes it
        read_rows(DatasetConfig(path=str(path.with_name("small.json"))))
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows = read_rows(DatasetConfig(path=str(path)))
        growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - start
        print(json.dumps({"prepare": (growth, len(rows.rows), rows.unreadable)}))
        sys.exit(0)
    small = path.with_name("small.jsonl")
    small.write_bytes(b'{"prompt": "warm", "completion": "up"}\\n')
    read_rows(DatasetConfig(path=str(small)))

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    start = peak()
    rows = read_rows(DatasetConfig(path=str(path)))
    prepare = (peak() - start, len(rows.rows), rows.unreadable)
    start = peak()
    with input_rows(path, 16 << 20) as lines:
        reasons = [getattr(item, "reason", "ok") for item in iter_prompts(lines, None)]
    total = count_lines(path, 16 << 20)
    generate = (peak() - start, reasons, total)
    print(json.dumps({"prepare": prepare, "generate": generate}))
    """
)


def test_memory_stays_bounded_reading_a_200_mb_line(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as file:
        file.write(_good(0))
        file.write(b'{"prompt": "')
        chunk = b"x" * (1 << 20)
        for _ in range(200):
            file.write(chunk)
        file.write(b'", "completion": "1"}\n')
        file.write(_good(1))
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    growth, rows, unreadable = result["prepare"]
    assert (rows, unreadable) == (3, 1)
    # The default bound is 16 MiB: what a reader holds of the 200 MiB line stays near it (holding it whole
    # took over 200 MiB, and parsing it several times that).
    assert growth < 80, f"prepare's reader grew by {growth:.0f} MiB"
    growth, reasons, total = result["generate"]
    assert reasons == ["ok", "row_too_large", "ok"] and total == 3
    assert growth < 80, f"generate's reader grew by {growth:.0f} MiB"


def test_memory_stays_bounded_reading_a_json_object_with_a_200_mb_row_and_a_200_mb_value(tmp_path: Path) -> None:
    (tmp_path / "small.json").write_text('{"data": [{"prompt": "warm", "completion": "up"}]}')
    path = tmp_path / "huge.json"
    chunk = b"x" * (1 << 20)
    with path.open("wb") as file:
        file.write(b'{"notes": "')
        for _ in range(200):  # a value beside the rows, skipped unread
            file.write(chunk)
        file.write(b'", "data": [' + _good(0).strip() + b', {"prompt": "')
        for _ in range(200):
            file.write(chunk)
        file.write(b'", "completion": "1"}, ' + _good(1).strip() + b"]}\n")
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    growth, rows, unreadable = json.loads(done.stdout)["prepare"]
    assert (rows, unreadable) == (3, 1)
    # Read whole, the 400 MiB file took over 400 MiB, and parsing it several times that.
    assert growth < 80, f"the reader grew by {growth:.0f} MiB"
