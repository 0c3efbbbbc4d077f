"""Cache keys of prepared datasets come from file fingerprints (size, streamed digest; a Parquet
file's footer and modification time), not from the rows: one changed byte changes the key, the
key's memory does not grow with the rows, and a cache hit reads no row."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from rayft.config import DatasetConfig, load_config
from rayft.data.cache_keys import cache_key, dataset_fingerprint, file_fingerprint


def _jsonl(path: Path, rows: int) -> Path:
    with path.open("w") as file:
        for i in range(rows):
            file.write(json.dumps({"prompt": f"What is {i}+1?", "completion": str(i + 1)}) + "\n")
    return path


def test_one_changed_byte_changes_the_key_and_a_touch_does_not(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", 100)
    cfg = load_config(None, [f"data.datasets=[{{path: '{path}'}}]"])

    def key() -> str:
        return cache_key(cfg.data, 0, "tok", [str(dataset_fingerprint(cfg.data.datasets[0]))])

    before = key()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one byte in the middle of the file
    path.write_bytes(bytes(data))
    assert key() != before
    changed = key()
    os.utime(path, ns=(1, 1))  # same content, another modification time
    assert key() == changed
    assert cache_key(cfg.data, 1, "tok", [str(dataset_fingerprint(cfg.data.datasets[0]))]) != changed


def test_a_parquet_file_is_known_by_its_footer_size_and_time(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    first = file_fingerprint(path)
    pq.write_table(pa.table({"text": ["a", "c"]}), path)  # same size, other statistics in the footer
    assert file_fingerprint(path) != first
    again = file_fingerprint(path)
    os.utime(path, ns=(1, 1))
    assert file_fingerprint(path) != again


def test_a_directory_is_known_by_its_files_and_their_names(tmp_path: Path) -> None:
    _jsonl(tmp_path / "a.jsonl", 3)
    _jsonl(tmp_path / "b.jsonl", 3)
    first = dataset_fingerprint(DatasetConfig(path=str(tmp_path)))
    (tmp_path / "b.jsonl").rename(tmp_path / "c.jsonl")
    assert dataset_fingerprint(DatasetConfig(path=str(tmp_path))) != first
    assert dataset_fingerprint(DatasetConfig(path="builtin:arithmetic")) == "builtin"
    assert dataset_fingerprint(DatasetConfig(path="s3://bucket/rows.parquet")) is None


def _fingerprint_peak(path: Path) -> int:
    tracemalloc.start()
    try:
        dataset_fingerprint(DatasetConfig(path=str(path)))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_key_takes_memory_independent_of_the_rows(tmp_path: Path) -> None:
    small = _jsonl(tmp_path / "small.jsonl", 1_000)
    large = _jsonl(tmp_path / "large.jsonl", 100_000)
    assert large.stat().st_size > 4_000_000
    small_peak, large_peak = _fingerprint_peak(small), _fingerprint_peak(large)
    # One 1 MiB read buffer at most, whatever the size of the file.
    assert large_peak < (1 << 20) + 100_000
    assert abs(large_peak - small_peak) < 50_000


def test_a_cache_hit_reads_no_row(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.data import prepare as prepare_module

    path = _jsonl(tmp_path / "qa.jsonl", 20)
    cfg = load_config(None, [f"model.name={tiny_model_dir}", f"data.datasets=[{{path: '{path}'}}]",
                             f"data.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    first = prepare_module.prepare(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)

    def refuse(*_: object) -> None:
        raise AssertionError("a cache hit must not read the rows")

    monkeypatch.setattr(prepare_module, "read_sources", refuse)
    again = prepare_module.prepare(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    assert again.reused and again.prepared == first.prepared
