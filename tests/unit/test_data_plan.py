"""The row planner of data preparation: held-out validation, weighted mixing, determinism."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rayft.data.split_plan import plan_records


def test_single_dataset_holds_out_a_fraction_and_shuffles_by_seed() -> None:
    records = plan_records([100], [1.0], train_sources=1, validation_fraction=0.1, seed=3)
    train = [r for r in records if r.split == "train"]
    validation = [r for r in records if r.split == "validation"]
    assert len(train) == 90 and len(validation) == 10
    assert sorted(r.row for r in records) == list(range(100))  # every row once, none in both splits
    assert [r.sample_id for r in records] == list(range(100))
    assert [r.row for r in train] != sorted(r.row for r in train)
    assert plan_records([100], [1.0], train_sources=1, validation_fraction=0.1, seed=3) == records
    assert plan_records([100], [1.0], train_sources=1, validation_fraction=0.1, seed=4) != records


def test_weights_set_the_share_of_each_dataset_upsampling_when_needed() -> None:
    records = plan_records([300, 100], [1.0, 3.0], train_sources=2, validation_fraction=0.0, seed=0)
    by_source = Counter(r.source for r in records)
    assert by_source == {0: 100, 1: 300}  # 400 rows in all, shared 1:3
    small = Counter(r.row for r in records if r.source == 1)
    assert set(small.values()) == {3}  # each row of the small set exactly three times
    assert len({r.row for r in records if r.source == 0}) == 100  # a sample without repeats


def test_validation_datasets_are_kept_whole_and_numbered_after_training() -> None:
    records = plan_records([50, 7], [1.0, 1.0], train_sources=1, validation_fraction=0.5, seed=0)
    assert [r.split for r in records] == ["train"] * 50 + ["validation"] * 7
    assert [(r.source, r.row) for r in records[50:]] == [(1, i) for i in range(7)]


def test_a_rows_split_does_not_depend_on_how_the_rows_are_cut_into_blocks() -> None:
    import numpy as np

    from rayft.data.split_plan import held_out, holdout_threshold

    size, fraction = 10_000, 0.07
    threshold = holdout_threshold(5, 0, size, fraction)
    whole = held_out(5, 0, np.arange(size), threshold)
    assert whole.sum() == round(size * fraction)
    for block in (1, 7, 256, 4096):
        pieces = [held_out(5, 0, np.arange(start, min(start + block, size)), threshold)
                  for start in range(0, size, block)]  # fmt: skip
        assert np.array_equal(np.concatenate(pieces), whole)
    # Another dataset position or seed holds out other rows.
    assert not np.array_equal(held_out(5, 1, np.arange(size), holdout_threshold(5, 1, size, fraction)), whole)
    assert not np.array_equal(held_out(6, 0, np.arange(size), holdout_threshold(6, 0, size, fraction)), whole)


def test_a_row_keeps_its_split_when_the_rows_after_it_change() -> None:
    # Growing a dataset moves the threshold a little, so a few rows change sides, never most.
    small = plan_records([1000], [1.0], train_sources=1, validation_fraction=0.1, seed=0)
    large = plan_records([1100], [1.0], train_sources=1, validation_fraction=0.1, seed=0)
    before = {r.row for r in small if r.split == "validation"}
    after = {r.row for r in large if r.split == "validation" and r.row < 1000}
    assert len(before ^ after) < 20


def test_prepared_splits_are_the_same_whatever_the_batch_size(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from rayft.config import load_config
    from rayft.data import windows
    from rayft.data.prepare import prepare_data

    cfg = load_config(None, [f"model.name={tiny_model_dir}", "data.validation_fraction=0.2",
                             "data.datasets=[{path: 'builtin:arithmetic', max_rows: 30}, "
                             "{path: 'builtin:sql', max_rows: 10, weight: 2.0}]"])  # fmt: skip
    tables = []
    for batch_rows in (3, 256):
        monkeypatch.setattr(windows, "BATCH_ROWS", batch_rows)
        monkeypatch.setenv("RAYFT_DATA_CACHE", str(tmp_path / f"cache-{batch_rows}"))
        prepared = prepare_data(cfg.data, cfg.model, 11, report_dir=None, use_ray=False)
        assert prepared.validation is not None
        tables.append([pq.read_table(f) for f in (*prepared.train.files, *prepared.validation.files)])
    assert all(a.equals(b) for a, b in zip(*tables, strict=True))
