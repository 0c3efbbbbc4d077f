"""SFT then preference training in ``rayft run``, planned without Ray: which stages run, what the
pairs are sampled from, where the preference training starts, its config, and what eval compares."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rayft.config import RayftConfig, load_config
from rayft.config.checks import check_unread_method_sections
from rayft.config.pairs import PreferenceStageConfig
from rayft.errors import ConfigError
from rayft.pipeline.inputs import final_manifest_hash
from rayft.pipeline.plan import requested_stages
from rayft.pipeline.preference_plan import (
    compare_sources,
    pairs_model_source,
    plan_preference_start,
    preference_stage_config,
)
from rayft.pipeline.preference_stage import PairsStage, PreferenceStage
from rayft.pipeline.stage import StageContext
from rayft.runs.layout import MANIFEST_FILE
from rayft.runs.location import RunLocation
from rayft.runs.records import StageRecord, trained_final

RUN = Path("/runs/p")


def record(stage: str, **outputs: str) -> StageRecord:
    return StageRecord(stage=stage, fingerprint="f", inputs={}, outputs=outputs)


TRAIN = record("train", final="train/final", dir="train")
PAIRS = record("pairs", data_jsonl="pairs/data.jsonl", dir="pairs")
PREFERENCE = record("preference", final="preference/final", dir="preference")


def config(*overrides: str) -> RayftConfig:
    return load_config(None, ["train.learning_rate=2e-3", "data.packing=true", *overrides])


def test_a_preference_section_requests_the_pairs_it_trains_on_after_sft() -> None:
    assert requested_stages({"train", "preference", "eval"}) == ["train", "pairs", "preference", "eval"]
    assert requested_stages({"sdg", "train", "pairs", "preference", "export"}) == [
        "sdg", "train", "pairs", "preference", "export",
    ]  # fmt: skip
    assert requested_stages({"pairs"}) == ["pairs"]


def test_pairs_are_sampled_from_the_sft_model_unless_a_model_is_named() -> None:
    cfg = config()
    assert pairs_model_source(cfg, RUN, {"train": TRAIN}) == str(RUN / "train/final")
    assert pairs_model_source(cfg, RUN, {}) == cfg.model.name
    assert pairs_model_source(config("pairs.model=/m/other"), RUN, {"train": TRAIN}) == "/m/other"


def test_preference_training_starts_from_the_merged_sft_adapter_or_the_sft_model() -> None:
    lora = plan_preference_start(config(), RUN, {"train": TRAIN})
    assert (lora.kind, lora.source, lora.target) == ("merge_adapter", str(RUN / "train/final"), str(RUN / "sft-merged"))
    full = plan_preference_start(config("train.method=full"), RUN, {"train": TRAIN})
    assert (full.kind, full.target) == ("model_dir", str(RUN / "train/final"))
    alone = plan_preference_start(config(), RUN, {})
    assert (alone.kind, alone.target) == ("model", config().model.name)


def test_the_preference_config_changes_only_what_the_stage_says() -> None:
    cfg = config(
        "preference.objective=orpo",
        "preference.train.learning_rate=5e-6",
        "preference.orpo_lambda=0.2",
        "preference.data.max_seq_length=256",
    )
    pref = preference_stage_config(cfg, str(RUN / "sft-merged"), RUN / "pairs/data.jsonl", str(RUN))
    assert (pref.name, pref.storage_path, pref.tune) == ("preference", str(RUN), None)
    assert pref.model.name == str(RUN / "sft-merged") and pref.model.gguf_file is None
    assert pref.train.objective == "orpo" and pref.train.learning_rate == 5e-6
    assert pref.train.preference.orpo_lambda == 0.2 and pref.train.preference.beta == cfg.train.preference.beta
    assert pref.train.num_epochs == cfg.train.num_epochs and pref.lora == cfg.lora
    assert pref.data.packing is False and pref.data.max_seq_length == 256
    assert [(d.path, d.name, d.use_chat_template) for d in pref.data.datasets] == [
        (str(RUN / "pairs/data.jsonl"), "pairs", True)
    ]
    assert cfg.train.objective == "sft"  # the SFT's own section is untouched


def test_a_bad_change_to_the_preference_training_is_refused_with_its_path() -> None:
    with pytest.raises(ConfigError, match=r"preference.train.learning_rate: Input should be greater than 0"):
        config("preference.train.learning_rate=-1")
    with pytest.raises(ConfigError, match=r"preference.train.lerning_rate: Extra inputs"):
        config("preference.train.lerning_rate=1e-5")
    with pytest.raises(ConfigError, match="preference.objective"):
        config("preference.objective=kto")
    with pytest.raises(ConfigError, match=r"preference\.beta = -1: Input should be greater than 0"):
        config("preference.beta=-1")


def test_the_old_nested_spelling_is_refused_with_the_new_path() -> None:
    with pytest.raises(
        ConfigError, match=r"preference\.train\.preference\.beta is no longer read.*write preference\.beta"
    ):
        config("preference.train.preference.beta=0.2")
    with pytest.raises(ValidationError, match=r"write preference\.orpo_lambda"):  # the same through rayft.api
        RayftConfig(preference=PreferenceStageConfig(train={"preference": {"orpo_lambda": 0.2}}))


def test_train_preference_beside_a_preference_stage_is_refused_as_unread() -> None:
    cfg = config("train.preference.beta=0.3", "preference.objective=dpo")
    with pytest.raises(ConfigError, match=r"train\.preference\.beta: .*ignored; move it to preference\.beta"):
        check_unread_method_sections(cfg, ["train", "pairs", "preference"])
    check_unread_method_sections(cfg, ["train"])  # without the stage, train.preference is the train stage's


def test_eval_compares_sft_with_the_preference_trained_model() -> None:
    cfg = config("preference.objective=simpo")
    both = {"train": TRAIN, "pairs": PAIRS, "preference": PREFERENCE}
    assert compare_sources(cfg, RUN, both) == {"sft": str(RUN / "train/final"), "simpo": str(RUN / "preference/final")}
    assert compare_sources(cfg, RUN, {"train": TRAIN}) == {"base": cfg.model.name, "tuned": str(RUN / "train/final")}
    assert list(compare_sources(cfg, RUN, {"pairs": PAIRS, "preference": PREFERENCE})) == ["base", "simpo"]
    assert trained_final(RUN, both) == RUN / "preference/final" and trained_final(RUN, {}) is None


def test_the_last_trained_model_decides_what_eval_and_export_see(tmp_path: Path) -> None:
    for stage in ("train", "preference"):
        (tmp_path / stage / "final").mkdir(parents=True)
        (tmp_path / stage / "final" / MANIFEST_FILE).write_text(stage)
    records = {"train": TRAIN, "preference": PREFERENCE}
    assert final_manifest_hash(tmp_path, records) == final_manifest_hash(tmp_path, records, "preference")
    assert final_manifest_hash(tmp_path, records) != final_manifest_hash(tmp_path, {"train": TRAIN})
    assert final_manifest_hash(tmp_path, {}, "train") is None


def test_the_stages_rerun_when_the_sft_model_or_the_pairs_change(tmp_path: Path) -> None:
    cfg = config()
    (tmp_path / "train" / "final").mkdir(parents=True)
    (tmp_path / "pairs").mkdir()
    manifest, pairs = tmp_path / "train" / "final" / MANIFEST_FILE, tmp_path / "pairs" / "data.jsonl"
    manifest.write_text("a")
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    ctx = StageContext(cfg, RunLocation(tmp_path), {"train": TRAIN, "pairs": PAIRS})
    before = (PairsStage().inputs(ctx), PreferenceStage().inputs(ctx))
    manifest.write_text("b")
    after_sft = (PairsStage().inputs(ctx), PreferenceStage().inputs(ctx))
    assert before[0] != after_sft[0] and before[1] != after_sft[1]
    pairs.write_text('{"prompt": "p", "chosen": "a", "rejected": "c"}\n')
    assert PreferenceStage().inputs(ctx) != after_sft[1] and PairsStage().inputs(ctx) == after_sft[0]
