"""prepare_data in-process on the tiny tokenizer: units follow the contract, the prompt is masked,
the cache is reused, rejected rows are reported, and the rejected-share threshold stops the run."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rayft.config import load_config
from rayft.config.schema import RayftConfig
from rayft.data.prepare import prepare_data
from rayft.data.prepared import IGNORE_INDEX, UNIT_COLUMNS, PreparedData
from rayft.errors import DataError


def _config(model_dir: Path, *overrides: str) -> RayftConfig:
    return load_config(None, [f"model.name={model_dir}", *overrides])


def _rows(prepared: PreparedData, split: str = "train") -> list[dict[str, object]]:
    files = prepared.train.files if split == "train" else prepared.validation.files  # type: ignore[union-attr]
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def test_builtin_arithmetic_units_follow_the_contract(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    cfg = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 40}]")
    prepared = prepare_data(cfg.data, cfg.model, 7, report_dir=tmp_path / "report", use_ray=False)

    assert prepared.train.num_units == 38 and prepared.validation is not None
    assert prepared.validation.num_units == 2
    assert prepared.stats["formats"]["builtin:arithmetic"].startswith("prompt_completion (detected")
    units = _rows(prepared)
    assert set(units[0]) == set(UNIT_COLUMNS)
    ids = sorted(s for u in units + _rows(prepared, "validation") for s in u["sample_ids"])  # type: ignore[attr-defined]
    assert ids == list(range(40))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for unit in units:
        labels, input_ids = unit["labels"], unit["input_ids"]
        assert unit["position_ids"] == list(range(len(input_ids)))  # type: ignore[arg-type]
        assert unit["num_label_tokens"] == sum(1 for x in labels if x != IGNORE_INDEX)  # type: ignore[attr-defined]
        trained = tokenizer.decode([x for x in labels if x != IGNORE_INDEX])  # type: ignore[attr-defined]
        text = tokenizer.decode(input_ids)
        assert text.startswith("<|im_start|>user\n")
        # Exactly the assistant turn is trained: the answer with its end-of-turn token.
        assert text.endswith(trained) and trained.startswith(text.split("<|im_start|>assistant\n")[1][:10])
        assert "#### " in trained and "<|im_end|>" in trained and "user" not in trained
    assert (tmp_path / "report" / "rejected.jsonl").read_text() == ""
    assert json.loads((tmp_path / "report" / "stats.json").read_text())["key"] == prepared.key


def test_same_inputs_reuse_the_cache_and_other_inputs_do_not(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]")
    first = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    manifest = Path(first.root) / "prepared.json"
    stamp = manifest.stat().st_mtime_ns
    again = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    assert again == first and manifest.stat().st_mtime_ns == stamp
    longer = _config(tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]",
                     "data.max_seq_length=768")  # fmt: skip
    assert prepare_data(longer.data, longer.model, 0, report_dir=None, use_ray=False).key != first.key
    assert prepare_data(cfg.data, cfg.model, 1, report_dir=None, use_ray=False).key != first.key


def test_bad_rows_are_reported_and_the_threshold_stops(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"What is {i}+1?", "completion": str(i + 1)} for i in range(18)]
    rows += [{"prompt": "Empty answer", "completion": "  "}, {"prompt": "No answer", "completion": None}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [f"data.datasets=[{{path: '{data}'}}]", "data.validation_fraction=0"]
    cfg = _config(tiny_model_dir, *base)
    with pytest.raises(DataError, match=r"2 of 20 rows \(10.0%\) were rejected.*empty_field: 1.*missing_field: 1"):
        prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "r1", use_ray=False)
    report = [json.loads(line) for line in (tmp_path / "r1" / "rejected.jsonl").read_text().splitlines()]
    assert sorted((r["row_id"], r["reason"]) for r in report) == [("qa.jsonl:18", "empty_field"),
                                                                  ("qa.jsonl:19", "missing_field")]  # fmt: skip
    lenient = _config(tiny_model_dir, *base, "data.max_rejected_fraction=0.2")
    prepared = prepare_data(lenient.data, lenient.model, 0, report_dir=tmp_path / "r2", use_ray=False)
    assert prepared.train.num_units == 18 and prepared.stats["rejected_total"] == 2


def test_packing_fills_sequences_and_keeps_every_example(tiny_model_dir: Path) -> None:
    rows = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 60}]"
    plain = _config(tiny_model_dir, rows, "data.max_seq_length=1024")
    packed_cfg = _config(tiny_model_dir, rows, "data.max_seq_length=1024", "data.packing=true")
    unpacked = prepare_data(plain.data, plain.model, 0, report_dir=None, use_ray=False)
    packed = prepare_data(packed_cfg.data, packed_cfg.model, 0, report_dir=None, use_ray=False)

    assert packed.packed and packed.key != unpacked.key
    assert packed.train.num_examples == unpacked.train.num_examples == 57
    assert packed.train.num_tokens == unpacked.train.num_tokens
    assert packed.train.num_label_tokens == unpacked.train.num_label_tokens
    assert packed.train.num_units < unpacked.train.num_units / 2
    units = _rows(packed)
    assert all(u["num_tokens"] <= 1024 for u in units)  # type: ignore[operator]
    assert sorted(s for u in units for s in u["sample_ids"]) == sorted(  # type: ignore[attr-defined]
        s
        for u in _rows(unpacked)
        for s in u["sample_ids"]  # type: ignore[attr-defined]
    )
    assert packed.stats["padding_efficiency"] == packed.train.num_tokens / (packed.train.num_units * 1024)
    assert packed.stats["padding_efficiency"] > 0.8  # 57 examples of ~200 tokens in ~11 bins


def test_a_cache_hit_needs_neither_transformers_nor_torch(tiny_model_dir: Path) -> None:
    import os
    import subprocess
    import sys

    rows = "data.datasets=[{path: 'builtin:arithmetic', max_rows: 20}]"
    cfg = _config(tiny_model_dir, rows)
    built = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    script = (
        "import sys\n"
        "from rayft.config import load_config\n"
        "from rayft.data.prepare import prepare\n"
        f"cfg = load_config(None, ['model.name={tiny_model_dir}', {rows!r}])\n"
        "out = prepare(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)\n"
        "print(out.reused, out.prepared.key, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, check=True)
    assert result.stdout.split() == ["True", built.key, "[]"]


def test_windows_are_runs_of_sample_ids_sized_by_the_split_alone() -> None:
    from rayft.data.windows import WINDOW_MAX, WINDOW_MIN, Window, plan_windows, window_size

    assert window_size(100) == WINDOW_MIN and window_size(10**6) == WINDOW_MAX
    assert window_size(40_000) == 5000  # an eighth of the split: every CPU of a small machine gets windows
    windows = plan_windows(5000, 5100)
    assert windows == [Window("train", 0, 0, 2048), Window("train", 1, 2048, 4096), Window("train", 2, 4096, 5000),
                       Window("validation", 0, 5000, 5100)]  # fmt: skip
    assert plan_windows(0, 0) == []


def test_data_of_one_window_is_prepared_without_ray_data_and_more_is_not(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from rayft.data import prepare, windows

    asked: list[int] = []

    def on_ray(job: object, settings: object, blocks: list[object], address: str | None = None) -> object:
        asked.append(len(blocks))
        return prepare.windows_in_process(job, settings, blocks)  # type: ignore[arg-type]

    monkeypatch.setattr(prepare, "windows_on_ray", on_ray)
    cfg = _config(
        tiny_model_dir, "data.datasets=[{path: 'builtin:arithmetic', max_rows: 64}]", "data.validation_fraction=0.1"
    )  # a train and a validation window
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "small"))
    with caplog.at_level("INFO", logger="rayft.data"):
        small = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=True)
    assert asked == [] and "in 2 windows in-process" in caplog.text
    assert windows.fits_one_window(windows.WINDOW_MIN) and not windows.fits_one_window(windows.WINDOW_MIN + 1)
    monkeypatch.setattr(windows, "WINDOW_MIN", 50)  # the same rows are now more than one smallest window
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "large"))
    large = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=True)
    assert asked == [3] and large.train.num_examples == small.train.num_examples


def _many_rows(path: Path, count: int, *, bad_every: int = 0) -> Path:
    rows = [{"prompt": f"What is {i} plus {i % 7}?", "completion": " " + "word " * (i % 37) + str(i)}
            for i in range(count)]  # fmt: skip
    path.write_text("".join(
        (json.dumps({"prompt": "no answer"}) if bad_every and i % bad_every == 0 else json.dumps(r)) + "\n"
        for i, r in enumerate(rows)
    ))  # fmt: skip
    return path


def test_windows_pack_like_the_whole_split_and_keep_every_example(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.data import windows

    data = _many_rows(tmp_path / "many.jsonl", 600)
    cfg = _config(tiny_model_dir, f"data.datasets=[{{path: '{data}'}}]", "data.packing=true",
                  "data.max_seq_length=256", "data.validation_fraction=0.05")  # fmt: skip
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "whole"))
    whole = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)
    monkeypatch.setattr(windows, "WINDOW_MIN", 100)  # 570 training examples in 6 windows
    monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / "windows"))
    windowed = prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)

    assert len(whole.train.files) == 1 and len(windowed.train.files) == 6
    assert windowed.train.num_examples == whole.train.num_examples == 570
    assert windowed.train.num_tokens == whole.train.num_tokens
    ids = [sorted(s for u in _rows(p) for s in u["sample_ids"]) for p in (whole, windowed)]  # type: ignore[attr-defined]
    assert ids[0] == ids[1] == list(range(570))
    units = _rows(windowed)
    assert all(u["num_tokens"] == len(u["input_ids"]) <= 256 for u in units)  # type: ignore[arg-type]
    # Window k holds sample ids 100k..100k+99 only: packing never reaches across windows.
    for file, k in zip(windowed.train.files, range(6), strict=True):
        assert {s // 100 for u in pq.read_table(file).to_pylist() for s in u["sample_ids"]} == {k}
    # Windows of ~100 examples of about half a unit each (the hard case for bin packing) cost under 5%.
    assert whole.train.num_units < windowed.train.num_units <= 1.05 * whole.train.num_units


def test_units_from_arrow_equal_units_from_python_lists() -> None:
    import pyarrow as pa

    from rayft.data.packing import build_units
    from rayft.data.windows import unit_table

    examples = [
        {"sample_id": 7, "input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]},
        {"sample_id": 3, "input_ids": [8, 9], "labels": [IGNORE_INDEX, 9]},
        {"sample_id": 9, "input_ids": [1, 2, 3, 4], "labels": [IGNORE_INDEX, IGNORE_INDEX, 3, 4]},
    ]
    table = pa.table({"sample_id": pa.array([e["sample_id"] for e in examples], pa.int64()),
                      "input_ids": pa.array([e["input_ids"] for e in examples], pa.list_(pa.int32())),
                      "labels": pa.array([e["labels"] for e in examples], pa.list_(pa.int32()))})  # fmt: skip
    packs = [[2, 0], [1]]
    assert unit_table(table, packs).to_pylist() == build_units(examples, packs)
    assert unit_table(table, None).to_pylist() == build_units(examples, [[0], [1], [2]])


def test_length_percentiles_from_a_histogram_match_numpy() -> None:
    import random
    from collections import Counter

    import numpy as np

    from rayft.data.stats import histogram_percentile

    rng = random.Random(0)
    for size in (1, 2, 5, 100, 1001):
        values = [rng.randint(1, 60) for _ in range(size)]
        for q in (0, 50, 90, 99, 100):
            assert histogram_percentile(Counter(values), q) == int(np.percentile(values, q)), (size, q)
    assert histogram_percentile(Counter(), 50) == 0


def test_too_many_rejected_rows_stop_before_the_remaining_windows(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.data import windows

    data = _many_rows(tmp_path / "bad.jsonl", 600, bad_every=2)
    cfg = _config(tiny_model_dir, f"data.datasets=[{{path: '{data}'}}]", "data.validation_fraction=0")
    monkeypatch.setattr(windows, "WINDOW_MIN", 100)
    seen: list[int] = []
    original = windows.prepare_window
    monkeypatch.setattr("rayft.data.executors.prepare_window",
                        lambda *args: seen.append(1) or original(*args))  # fmt: skip
    with pytest.raises(DataError, match=r"of 600 rows .* in the first 1 of 6 windows \(stopped early\).*missing_field"):
        prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path / "report", use_ray=False)
    assert len(seen) == 1
    report = [json.loads(line) for line in (tmp_path / "report" / "rejected.jsonl").read_text().splitlines()]
    assert report and {r["reason"] for r in report} == {"missing_field"}
    assert all(r["line"] % 2 == 1 for r in report)  # rows 0, 2, 4, ... are lines 1, 3, 5, ...


def test_many_rows_cut_to_the_length_limit_are_warned_about_with_counts_and_the_fix(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "completion": " word" * (40 if i < 6 else 2)}) + "\n"
                            for i in range(10)))  # fmt: skip
    cut = _config(tiny_model_dir, f"data.datasets=[{{path: '{rows}'}}]", "data.max_seq_length=24",
                  "data.validation_fraction=0")  # fmt: skip
    with caplog.at_level("WARNING", logger="rayft.data"):
        prepare_data(cut.data, cut.model, 0, report_dir=None, use_ray=False)
    warned = [r.getMessage() for r in caplog.records if "cut to it" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("data: 6 of 10 rows (60%) are longer than data.max_seq_length=24")
    assert "Raise data.max_seq_length" in warned[0] and "data.overlong=drop" in warned[0]
    caplog.clear()
    whole = _config(tiny_model_dir, f"data.datasets=[{{path: '{rows}'}}]", "data.max_seq_length=512",
                    "data.validation_fraction=0")  # fmt: skip
    with caplog.at_level("WARNING", logger="rayft.data"):
        prepare_data(whole.data, whole.model, 0, report_dir=None, use_ray=False)
    assert not [r for r in caplog.records if "cut to it" in r.getMessage()]
