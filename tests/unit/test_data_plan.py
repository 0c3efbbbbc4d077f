"""The row planner of data preparation: held-out validation, weighted mixing, determinism."""

from __future__ import annotations

from collections import Counter

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
