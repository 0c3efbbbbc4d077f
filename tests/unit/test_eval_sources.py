"""Choosing a run's checkpoint and resolving model sources, on directories written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rayft.config import ModelConfig, dump_config, load_config
from rayft.errors import CheckpointError, ModelError
from rayft.models.sources import resolve_source
from rayft.runs.manifest import write_manifest
from rayft.runs.selection import CheckpointInfo, choose_checkpoint

STEPS = [
    CheckpointInfo("step-000002", 2, True, 1.5),
    CheckpointInfo("step-000004", 4, True, 1.1),
    CheckpointInfo("step-000006", 6, True, 1.3),
    CheckpointInfo("step-000008", 8, False, None),  # an interrupted save never counts
]
FINAL = CheckpointInfo("final", 6, True, 1.3)


@pytest.mark.parametrize(
    ("final", "selector", "expected"),
    [
        (FINAL, "latest", "final"),
        (None, "latest", "checkpoints/step-000006"),
        (FINAL, "best", "checkpoints/step-000004"),
        (FINAL, "final", "final"),
        (FINAL, "step-2", "checkpoints/step-000002"),
        (None, "step-000004", "checkpoints/step-000004"),
    ],
)
def test_choose_checkpoint(final: CheckpointInfo | None, selector: str, expected: str) -> None:
    assert choose_checkpoint(STEPS, final, selector) == expected


def test_best_prefers_final_when_it_has_the_lowest_loss() -> None:
    assert choose_checkpoint(STEPS, CheckpointInfo("final", 9, True, 0.9), "best") == "final"


@pytest.mark.parametrize(
    ("checkpoints", "final", "selector", "message"),
    [
        (STEPS, None, "step-8", "no complete checkpoint step-8 .*step-000002, step-000004, step-000006"),
        (STEPS, None, "final", "no complete final/"),
        ([], None, "latest", "no complete checkpoint; train it first"),
        ([CheckpointInfo("step-000002", 2, True, None)], None, "best", "no validation data, so use latest or step-N"),
    ],
)
def test_choose_checkpoint_errors_say_what_the_run_has(
    checkpoints: list[CheckpointInfo], final: CheckpointInfo | None, selector: str, message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        choose_checkpoint(checkpoints, final, selector)


def _fake_lora_checkpoint(directory: Path, base: str, step: int, eval_loss: float) -> None:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "elsewhere"}))
    (directory / "adapter_model.safetensors").write_bytes(b"weights")
    cfg = load_config(None, [f"model.name={base}", "model.chat_template={{ messages }}"])
    (directory / "rayft_config.yaml").write_text(dump_config(cfg))
    write_manifest(directory, step, {"eval/loss": eval_loss}, {"data_key": "abc"})


def test_run_dir_resolves_to_lora_on_its_base_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: run\n")
    _fake_lora_checkpoint(run / "checkpoints" / "step-000002", "my/base-model", 2, 0.8)
    _fake_lora_checkpoint(run / "checkpoints" / "step-000004", "my/base-model", 4, 0.9)
    latest = resolve_source(str(run), ModelConfig(), "latest")
    assert latest.kind == "lora"
    assert latest.adapter_path == str(run / "checkpoints" / "step-000004")
    assert latest.model.name == "my/base-model"  # from rayft_config.yaml, not adapter_config.json
    assert latest.model.chat_template == "{{ messages }}"
    assert (latest.step, latest.metrics, latest.lineage) == (4, {"eval/loss": 0.9}, {"data_key": "abc"})
    best = resolve_source(str(run), ModelConfig(), "best")
    assert best.step == 2


def test_adapter_without_rayft_config_uses_adapter_config_base(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "base_model_name_or_path": "org/base"}))
    resolved = resolve_source(str(adapter), ModelConfig(dtype="float32"), "latest")
    assert (resolved.kind, resolved.model.name, resolved.model.dtype) == ("lora", "org/base", "float32")


def test_damaged_checkpoint_is_refused_with_the_bad_file(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-000002"
    _fake_lora_checkpoint(ckpt, "my/base-model", 2, 0.8)
    (ckpt / "adapter_model.safetensors").write_bytes(b"weig")  # truncated after the manifest was written
    with pytest.raises(CheckpointError, match=r"damaged: .*adapter_model.safetensors: size 4 differs"):
        resolve_source(str(ckpt), ModelConfig(), "latest")


def test_model_names_keep_the_configured_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for repo in ("models--org--a", "models--org--b"):  # Hub models in the local cache: usable offline
        (tmp_path / "hub" / repo).mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    default = ModelConfig(name="org/a", dtype="bfloat16", revision="main")
    assert resolve_source("org/a", default).model == default
    other = resolve_source("org/b", default).model
    assert (other.name, other.dtype, other.revision) == ("org/b", "bfloat16", None)
    with pytest.raises(ModelError, match="neither a model directory"):
        resolve_source(str(tmp_path / "hub"), default)


def test_a_custom_task_checkpoint_is_refused_with_how_to_load_it(tmp_path: Path) -> None:
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"weights")
    write_manifest(final, 9, {"eval/accuracy": 0.9}, {"method": "task", "task": "tasks.py:Digits", "final": True})
    with pytest.raises(ModelError, match=r"custom task's model \(tasks.py:Digits\), not a language model.*load_file"):
        resolve_source(str(final), ModelConfig())
