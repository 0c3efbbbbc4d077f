"""Pipeline planning: requested stages, --from/--only/--force, and skip decisions by fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.errors import ConfigError
from rayft.pipeline.fingerprint import hash_object, hash_tree
from rayft.pipeline.plan import decide, requested_stages, runnable_stages
from rayft.runs.location import RunLocation
from rayft.runs.records import StageRecord, outputs_exist, read_record, write_record

ALL = ["sdg", "train", "eval", "export"]


def test_requested_stages_follow_pipeline_order() -> None:
    assert requested_stages({"export", "model", "sdg", "train", "eval"}) == ALL
    assert requested_stages({"train", "model"}) == ["train"]
    assert requested_stages({"tune", "eval"}) == ["tune", "train", "eval"]
    assert requested_stages({"tune", "export"}) == ["tune", "train", "export"]


def test_config_without_stage_or_with_missing_dependency_is_refused() -> None:
    with pytest.raises(ConfigError, match="names no pipeline stage"):
        requested_stages({"model", "data"})
    with pytest.raises(ConfigError, match="'export' needs the 'train'"):
        requested_stages({"export"})


def test_only_and_from_select_and_force() -> None:
    assert runnable_stages(ALL, from_stage=None, only=None) == (ALL, set())
    assert runnable_stages(ALL, from_stage="eval", only=None) == (["eval", "export"], {"eval", "export"})
    assert runnable_stages(ALL, from_stage=None, only="train") == (["train"], {"train"})
    with pytest.raises(ConfigError, match="cannot be combined"):
        runnable_stages(ALL, from_stage="eval", only="train")
    with pytest.raises(ConfigError, match="--only sdg: the config does not request"):
        runnable_stages(["train"], from_stage=None, only="sdg")


def test_decisions() -> None:
    allowed = ALL
    assert decide("train", "f1", None, allowed=allowed, forced=()).action == "run"
    skip = decide("train", "f1", "f1", allowed=allowed, forced=())
    assert skip.action == "skip" and "up to date" in skip.reason
    changed = decide("train", "f2", "f1", allowed=allowed, forced=())
    assert changed.action == "run" and "inputs changed" in changed.reason
    assert decide("train", "f1", "f1", allowed=allowed, forced={"train"}).action == "run"
    assert decide("sdg", "f1", "f0", allowed=["eval"], forced={"eval"}).action == "reuse"
    with pytest.raises(ConfigError, match="no finished output"):
        decide("sdg", "f1", None, allowed=["eval"], forced={"eval"})
    # --only train on a fresh directory: the stages after it have nothing yet and nothing needs them.
    later = decide("eval", "f1", None, allowed=["train"], forced={"train"})
    assert later.action == "skip" and "not selected" in later.reason


def test_a_stage_left_out_is_not_fingerprinted(tmp_path: Path) -> None:
    from rayft.config import load_config
    from rayft.pipeline.runner import decide_stage
    from rayft.pipeline.stage import StageContext

    class Preference:  # its inputs are the pairs stage's outputs, which --only train never makes
        name = "preference"

        def inputs(self, ctx: StageContext) -> dict[str, str]:
            raise AssertionError("a stage that cannot run was fingerprinted")

    ctx = StageContext(load_config(None, []), RunLocation(tmp_path), {})
    decision, inputs = decide_stage(Preference(), ctx, allowed=["train"], forced={"train"})  # type: ignore[arg-type]
    assert decision.action == "skip" and inputs == {}


def test_fingerprints_are_canonical_and_content_based(tmp_path: Path) -> None:
    assert hash_object({"a": 1, "b": [1, 2]}) == hash_object({"b": [1, 2], "a": 1})
    assert hash_object({"a": 1}) != hash_object({"a": 2})
    (tmp_path / "x").write_text("one")
    first = hash_tree(tmp_path)
    (tmp_path / "x").write_text("two")
    assert hash_tree(tmp_path) != first


def test_records_round_trip_and_missing_outputs(tmp_path: Path) -> None:
    assert read_record(tmp_path, "train") is None
    (tmp_path / "train").mkdir()
    record = StageRecord("train", "abc", {"k": 1}, {"dir": "train"}, {"steps": 3}, 1.0, 2.5)
    write_record(tmp_path, record)
    assert read_record(tmp_path, "train") == record
    assert outputs_exist(tmp_path, record)
    (tmp_path / "train").rmdir()
    assert not outputs_exist(tmp_path, record)
