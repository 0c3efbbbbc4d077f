"""The export plan (rayft.export.plan): what is exported, where, merged or not, and the refusals
made before any model loads; on checkpoint directories written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import ModelConfig
from rayft.errors import ConfigError, RunStateError
from rayft.export.plan import plan_export


def _adapter(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "org/base"}))
    return directory


def _model_dir(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / "tokenizer.json").write_text("{}")
    return directory


@pytest.mark.parametrize("merge", [True, False])
def test_a_lora_checkpoint_is_merged_only_when_asked(tmp_path: Path, merge: bool) -> None:
    adapter = _adapter(tmp_path / "adapter")
    plan = plan_export(str(adapter), tmp_path / "out", ModelConfig(), "latest", merge=merge)
    assert (plan.kind, plan.merged, plan.target) == ("lora", merge, (tmp_path / "out").resolve())
    assert plan.source.adapter_path == str(adapter)


def test_an_empty_target_directory_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    plan = plan_export(str(_adapter(tmp_path / "adapter")), tmp_path / "out", ModelConfig(), "latest", merge=True)
    assert plan.target == (tmp_path / "out").resolve()


def test_a_missing_source_is_refused_with_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'.*nowhere' does not exist or is not a directory; give a run directory"):
        plan_export(str(tmp_path / "nowhere"), tmp_path / "out", ModelConfig(), "latest", merge=True)


def test_a_model_that_is_no_training_checkpoint_is_refused(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "model")
    with pytest.raises(ConfigError, match="is a model, not a training checkpoint"):
        plan_export(str(model), tmp_path / "out", ModelConfig(), "latest", merge=True)


@pytest.mark.parametrize("occupied", ["file", "non-empty directory"])
def test_an_occupied_target_is_refused_before_anything_loads(tmp_path: Path, occupied: str) -> None:
    target = tmp_path / "out"
    if occupied == "file":
        target.write_text("x")
    else:
        target.mkdir()
        (target / "keep.txt").write_text("x")
    with pytest.raises(RunStateError, match="already exists and is not empty; choose a new directory"):
        plan_export(str(_adapter(tmp_path / "adapter")), target, ModelConfig(), "latest", merge=True)


def _pipeline(root: Path, tiny_model_dir: Path, trained: tuple[str, ...]) -> Path:
    """A pipeline run directory as `rayft run` leaves it: stage records, and a run per training stage."""
    from tests.support.checkpoints import build_run_dir

    (root / "stages").mkdir(parents=True)
    (root / "stages" / "sdg.json").write_text("{}")
    for stage in trained:
        build_run_dir(root / stage, tiny_model_dir, eval_losses={1: None}, method="lora")
        (root / "stages" / f"{stage}.json").write_text("{}")
    return root


def test_a_pipeline_directory_stands_for_its_final_trained_model(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rayft.models.sources import resolve_source

    sft = _pipeline(tmp_path / "quickstart", tiny_model_dir, ("train",))
    with caplog.at_level("INFO"):
        plan = plan_export(str(sft), tmp_path / "out", ModelConfig(), "latest", merge=True)
    assert plan.source.adapter_path == str(sft / "train" / "final")
    assert f"{sft} is a pipeline run; using its trained model in {sft / 'train'}" in caplog.text
    dpo = _pipeline(tmp_path / "dpo", tiny_model_dir, ("train", "preference"))
    assert resolve_source(str(dpo), ModelConfig()).adapter_path == str(dpo / "preference" / "final")


def test_a_pipeline_directory_without_a_trained_model_is_refused_naming_its_stages(tmp_path: Path) -> None:
    from rayft.errors import ModelError

    untrained = tmp_path / "sdg-only"
    (untrained / "stages").mkdir(parents=True)
    (untrained / "stages" / "sdg.json").write_text("{}")
    with pytest.raises(ModelError, match=r"sdg-only is a pipeline run with no trained model \(finished stages: sdg\)"):
        plan_export(str(untrained), tmp_path / "out", ModelConfig(), "latest", merge=True)


@pytest.mark.parametrize("with_records_dir", [False, True])
def test_a_pipeline_stopped_in_its_train_stage_is_recognised_and_its_checkpoints_named(
    tiny_model_dir: Path, tmp_path: Path, with_records_dir: bool
) -> None:
    """`rayft run` stopped in its first training stage leaves the pipeline's config and log and the stage's run
    directory with checkpoints, but no stage record: export and chat (one resolver) say what it is and what to do."""
    from rayft.errors import ModelError
    from rayft.models.sources import resolve_source
    from tests.support.checkpoints import build_run_dir

    stopped = tmp_path / "stopped"
    (stopped / "logs").mkdir(parents=True)
    (stopped / "config.yaml").write_text("name: stopped\n")
    if with_records_dir:  # as `rayft run` now leaves it from its start
        (stopped / "stages").mkdir()
    build_run_dir(stopped / "train", tiny_model_dir, eval_losses={1: None}, method="lora", final=False)
    expected = (
        rf"stopped is a pipeline run whose train stage did not finish; run the pipeline again \(rayft run CONFIG\), "
        rf"or give its stage's run directory {stopped / 'train'} to use its checkpoints"
    )
    with pytest.raises(ModelError, match=expected):
        plan_export(str(stopped), tmp_path / "out", ModelConfig(), "latest", merge=True)
    with pytest.raises(ModelError, match=expected):
        resolve_source(str(stopped), ModelConfig())
