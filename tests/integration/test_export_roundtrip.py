"""rayft export on real (short, in-process) training runs of the tiny model, and on corrupted adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rayft.config import load_config
from rayft.data.prepared import PreparedData
from rayft.errors import CheckpointError
from tests.support.runs import tiny_config, train_on

pytestmark = pytest.mark.integration

PROMPTS = ["What is 3 + 4?", "Maya buys 2 boxes of 5 pencils."]


@pytest.fixture(scope="module")
def prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedData:
    from transformers import AutoTokenizer

    from rayft.testing.units import arithmetic_prepared

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return arithmetic_prepared(tmp_path_factory.mktemp("units"), tokenizer, num_train=16)


def _train(model_dir: Path, storage: Path, prepared: PreparedData, *overrides: str) -> Path:
    cfg = tiny_config(model_dir, storage, "scaling.num_workers=0", "train.max_steps=4", *overrides)
    return train_on(cfg, prepared)


def _logits(model: object, tokenizer: object) -> object:
    import torch

    tokenizer.padding_side = "left"  # type: ignore[attr-defined]
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)  # type: ignore[operator]
    with torch.inference_mode():
        out = model(**batch).logits  # type: ignore[operator]
    return out[batch["attention_mask"].bool()]


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir: Path, prepared: PreparedData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tiny_model_dir, tmp_path_factory.mktemp("lora-runs"), prepared)


def test_lora_run_exports_merged_and_reloads_with_the_same_logits(
    tiny_model_dir: Path, lora_run: Path, tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rayft.recipes.export import export_model

    cfg = load_config(None, [f"model.name={tiny_model_dir}"])
    result = export_model(cfg, str(lora_run), tmp_path / "merged")
    assert result.merged and result.kind == "lora"
    v = result.verification
    assert v["merge_max_abs_logit_diff"] <= 1e-4
    assert v["reload_max_abs_logit_diff"] <= 1e-4
    assert v["adapter_effect_max_abs_logit"] > 0
    assert v["reload_generate_ok"] is True
    out = result.output_dir
    assert (out / "model.safetensors").is_file() and not (out / "adapter_model.safetensors").exists()
    assert (out / "chat_template.jinja").is_file()
    assert not list(out.parent.glob(".merged.export-partial-*"))

    # Independent of the export's own checks: the exported model equals base + adapter of final/.
    tokenizer = AutoTokenizer.from_pretrained(out)
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora_run / "final")
    diff = (_logits(exported, tokenizer) - _logits(reference.eval(), tokenizer)).abs().max()  # type: ignore[operator]
    # Merging rounds each weight W + s * B @ A to float32 once (within 2**-24 of itself): a logit moves by about
    # sqrt(64) * 2**-24 of its terms per layer (64: the hidden width), ~1e-6 for this model's logits of a few
    # units, on any kernel. 1e-4 leaves 100x; a merge that drops the scale s or an adapter moves logits by ~1e-1.
    assert float(diff) <= 1e-4
    generation = json.loads((out / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in (
        generation["eos_token_id"] if isinstance(generation["eos_token_id"], list) else [generation["eos_token_id"]]
    )
    card = (out / "README.md").read_text()
    manifest = json.loads((lora_run / "final" / "rayft_checkpoint.json").read_text())
    assert f'base_model: "{tiny_model_dir}"' in card
    assert manifest["info"]["data_key"] in card
    assert "train/loss" in card and "## Training config" in card


def test_lora_run_exports_the_adapter_alone(tiny_model_dir: Path, lora_run: Path, tmp_path: Path) -> None:
    from rayft.cli.main import cli

    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, ["export", str(lora_run), str(out), "--no-merge", f"model.name={tiny_model_dir}"])
    assert result.exit_code == 0, result.output
    assert "Exported adapter" in result.output
    assert (out / "adapter_model.safetensors").read_bytes() == (
        lora_run / "final" / "adapter_model.safetensors"
    ).read_bytes()
    assert not (out / "model.safetensors").exists()
    verification = json.loads((out / "rayft_export.json").read_text())
    assert verification["reload_max_abs_logit_diff"] == 0.0
    assert verification["adapter"]["r"] == 4
    assert "library_name: peft" in (out / "README.md").read_text()


def test_full_fine_tuning_exports(tiny_model_dir: Path, prepared: PreparedData, tmp_path: Path) -> None:
    from rayft.recipes.export import export_model

    run = _train(tiny_model_dir, tmp_path / "runs", prepared, "train.method=full", "train.learning_rate=1e-3")
    cfg = load_config(None, [f"model.name={tiny_model_dir}", "eval.checkpoint=step-2"])
    result = export_model(cfg, str(run), tmp_path / "full")
    assert (result.kind, result.merged) == ("full", False)
    assert result.verification["reload_max_abs_logit_diff"] <= 1e-4
    card = (result.output_dir / "README.md").read_text()
    assert "| step | 2 |" in card and "full-finetune" in card


def _corrupt_copy(final: Path, target: Path, *, keep_manifest: bool) -> Path:
    import shutil

    shutil.copytree(final, target)
    if not keep_manifest:
        (target / "rayft_checkpoint.json").unlink()
    return target


def test_corrupted_adapters_are_caught(tiny_model_dir: Path, lora_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from rayft.cli.main import cli
    from rayft.recipes.export import export_model

    cfg = load_config(None, [f"model.name={tiny_model_dir}"])
    final = lora_run / "final"

    zero = _corrupt_copy(final, tmp_path / "zero", keep_manifest=False)
    tensors = load_file(str(zero / "adapter_model.safetensors"))
    save_file({k: v * 0 if "lora_B" in k else v for k, v in tensors.items()}, str(zero / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="is all zero .* the adapter changes nothing"):
        export_model(cfg, str(zero), tmp_path / "out-zero")
    assert not (tmp_path / "out-zero").exists()

    shapes = _corrupt_copy(final, tmp_path / "shapes", keep_manifest=False)
    save_file(
        {k: v[:2].contiguous() if "lora_A" in k else v for k, v in tensors.items()},
        str(shapes / "adapter_model.safetensors"),
    )
    with pytest.raises(CheckpointError, match=r"lora_A \(2, 32\) .* expected \(r, in\) and \(out, r\) with r=4"):
        export_model(cfg, str(shapes), tmp_path / "out-shapes")

    truncated = _corrupt_copy(final, tmp_path / "truncated", keep_manifest=False)
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="cannot be read .* truncated or corrupted"):
        export_model(cfg, str(truncated), tmp_path / "out-truncated")

    damaged = _corrupt_copy(final, tmp_path / "damaged", keep_manifest=True)
    (damaged / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    result = CliRunner().invoke(
        cli, ["export", str(damaged), str(tmp_path / "out-damaged"), f"model.name={tiny_model_dir}"]
    )
    assert result.exit_code == 2
    assert "Error: checkpoint" in result.output and "is damaged" in result.output and "size 16 differs" in result.output


def test_export_refuses_a_non_empty_target(tiny_model_dir: Path, lora_run: Path, tmp_path: Path) -> None:
    from rayft.errors import RunStateError
    from rayft.recipes.export import export_model

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(RunStateError, match="already exists and is not empty"):
        export_model(load_config(None, [f"model.name={tiny_model_dir}"]), str(lora_run), tmp_path / "busy")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


def test_gguf_files_are_named_after_where_the_export_ends_not_its_staging_directory(
    tiny_model_dir: Path, lora_run: Path, tmp_path: Path
) -> None:
    """The pipeline's export stage writes into a staging directory and renames it to <run>/export: the
    files and the Modelfile name the final directory."""
    from rayft.recipes.export import run

    cfg = load_config(None, [f"model.name={tiny_model_dir}", "export.format=gguf", "export.gguf_types=[q8_0]"])
    staging = tmp_path / ".export.partial-1"
    run(cfg, str(lora_run), staging, destination=tmp_path / "export")
    assert [p.name for p in staging.glob("*.gguf")] == ["export-q8_0.gguf"]
    assert (staging / "Modelfile").read_text().startswith("FROM ./export-q8_0.gguf\n")


def test_lora_run_exports_gguf_files_and_a_modelfile(tiny_model_dir: Path, lora_run: Path, tmp_path: Path) -> None:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from rayft.cli.main import cli

    out = tmp_path / "tuned"
    args = ["export", str(lora_run), str(out), "--gguf-types", "f16,q4_0", f"model.name={tiny_model_dir}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.glob("*.gguf")) == ["tuned-f16.gguf", "tuned-q4_0.gguf"]
    assert (out / "Modelfile").read_text().startswith("FROM ./tuned-f16.gguf\n")
    recorded = json.loads((out / "rayft_export.json").read_text())["gguf"]
    assert [g["type"] for g in recorded] == ["f16", "q4_0"]
    # The GGUF holds the merged weights (not the base model's): its down projection is the export's, in f16.
    merged = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    tensors = {t.name: t for t in gguf.GGUFReader(str(out / "tuned-f16.gguf")).tensors}
    assert np.array_equal(np.asarray(tensors["blk.0.ffn_down.weight"].data), merged.astype(np.float16))
    base = load_file(str(tiny_model_dir / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    assert not np.array_equal(base.astype(np.float16), merged.astype(np.float16))
