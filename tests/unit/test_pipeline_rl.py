"""SFT then GRPO in ``rayft run``, planned without Ray: the stages, the RL run's config, and what eval
compares and export exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rayft.config import RayftConfig, load_config
from rayft.config.checks import check_rl_stage, check_unread_method_sections
from rayft.config.rl_stage import RlStageConfig
from rayft.errors import ConfigError
from rayft.pipeline.plan import requested_stages
from rayft.pipeline.preference_plan import compare_sources
from rayft.pipeline.rl_stage import rl_stage_config
from rayft.pipeline.stage import StageContext
from rayft.runs.location import RunLocation
from rayft.runs.records import StageRecord, trained_final

RUN = Path("/runs/p")


def record(stage: str, **outputs: str) -> StageRecord:
    return StageRecord(stage=stage, fingerprint="f", inputs={}, outputs=outputs)


TRAIN = record("train", final="train/final", dir="train")
RL = record("rl", final="rl/final", dir="rl")


def config(*overrides: str) -> RayftConfig:
    return load_config(None, ["train.learning_rate=2e-3", "data.packing=true", *overrides])


def test_an_rl_section_is_a_stage_after_train_and_before_eval() -> None:
    assert requested_stages({"train", "rl", "eval", "export"}) == ["train", "rl", "eval", "export"]
    assert requested_stages({"rl"}) == ["rl"]
    with pytest.raises(ConfigError, match="both an rl and a preference section"):
        requested_stages({"train", "preference", "rl"})


def test_the_rl_config_is_grpo_with_the_stages_changes_and_no_packing() -> None:
    cfg = config("rl.train.learning_rate=5e-5", "rl.group_size=4", "rl.loss=dapo", "rl.data.max_seq_length=256")
    ctx = StageContext(cfg=cfg, location=RunLocation(RUN), records={"train": TRAIN})
    rl = rl_stage_config(ctx, str(RUN / "sft-merged"), str(RUN))
    assert (rl.name, rl.storage_path, rl.tune, rl.model.name) == ("rl", str(RUN), None, str(RUN / "sft-merged"))
    assert rl.train.objective == "grpo" and rl.train.learning_rate == 5e-5 and rl.train.rl.group_size == 4
    assert rl.train.rl.loss == "dapo" and rl.train.rl.rewards == cfg.rl.rewards
    assert rl.train.micro_batch_size == cfg.train.micro_batch_size and rl.lora == cfg.lora
    assert rl.data.packing is False and rl.data.max_seq_length == 256 and rl.data.datasets == cfg.data.datasets


def test_eval_compares_sft_with_grpo_and_the_rl_model_is_the_pipelines_final() -> None:
    records = {"train": TRAIN, "rl": RL}
    assert compare_sources(config(), RUN, records) == {"sft": str(RUN / "train/final"), "grpo": str(RUN / "rl/final")}
    assert trained_final(RUN, records) == RUN / "rl/final"
    assert compare_sources(config(), RUN, {"rl": RL}) == {"base": config().model.name, "grpo": str(RUN / "rl/final")}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rl.train.reward_scale=1"], r"rl\.train\.reward_scale: Extra inputs"),
        (["rl.train.learning_rat=1"], r"rl\.train\.learning_rat"),
    ],
)
def test_rl_stage_settings_that_cannot_work_are_refused_before_the_pipeline_runs(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_rl_stage(config(*overrides))


def test_the_rl_settings_are_the_stages_own_and_refused_with_their_path() -> None:
    with pytest.raises(ConfigError, match=r"rl\.group_size = 1: Input should be greater than or equal to 2"):
        config("rl.group_size=1")
    with pytest.raises(ConfigError, match=r"rl\.train\.rl\.group_size is no longer read.*write rl\.group_size"):
        config("rl.train.rl.group_size=4")
    with pytest.raises(ValidationError, match=r"write rl\.rewards"):  # the same through rayft.api
        RayftConfig(rl=RlStageConfig(train={"rl": {"rewards": []}}))


def test_train_rl_beside_an_rl_stage_is_refused_as_unread() -> None:
    cfg = config("train.rl.group_size=4", "rl.max_new_tokens=8")
    with pytest.raises(ConfigError, match=r"train\.rl\.group_size: .*ignored; move it to rl\.group_size"):
        check_unread_method_sections(cfg, ["train", "rl"])
    check_unread_method_sections(config(), ["train", "rl"])


def test_a_deepspeed_config_without_an_rl_stage_loads_and_round_trips(tmp_path: Path) -> None:
    from rayft.config import dump_config

    cfg = config("train.strategy=deepspeed")
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg
    check_rl_stage(config("rl.train.strategy=deepspeed"))  # GRPO samples from ZeRO-3's gathered weights
