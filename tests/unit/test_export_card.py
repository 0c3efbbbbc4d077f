"""The model card of an export carries the lineage: base model, data fingerprint, step, metrics, config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rayft.config.model import ModelConfig
from rayft.export.card import base_model_id, render_model_card
from rayft.models.sources import ResolvedSource


def _source(tmp_path: Path, kind: str = "lora") -> ResolvedSource:
    (tmp_path / "rayft_config.yaml").write_text("name: demo\nlora:\n  r: 16\n")
    return ResolvedSource(
        source="runs/demo",
        kind=kind,  # type: ignore[arg-type]
        model=ModelConfig(name="smollm2-135m-instruct"),
        adapter_path=str(tmp_path) if kind == "lora" else None,
        checkpoint_dir=str(tmp_path),
        step=12,
        metrics={"step": 12.0, "train/loss": 0.0831, "eval/loss": 0.0896},
        lineage={"method": kind, "base_model": "smollm2-135m-instruct", "data_key": "f6f4208d", "world_size": 1},
    )


def test_merged_lora_card(tmp_path: Path) -> None:
    card = render_model_card(_source(tmp_path), {"merge_max_abs_logit_diff": 0.0}, merged=True)
    assert card.startswith('---\nbase_model: "HuggingFaceTB/SmolLM2-135M-Instruct"\nlibrary_name: transformers\n')
    assert "LoRA adapter merged into the base weights" in card
    assert "| data fingerprint | `f6f4208d` |" in card
    assert "| step | 12 |" in card
    assert "| eval/loss | 0.0896 |" in card and "| step | 12.0" not in card
    assert '"merge_max_abs_logit_diff": 0.0' in card
    assert "## Training config\n\n```yaml\nname: demo\nlora:\n  r: 16\n```" in card
    assert "AutoModelForCausalLM.from_pretrained" in card


def test_adapter_only_and_full_cards(tmp_path: Path) -> None:
    adapter = render_model_card(_source(tmp_path), {}, merged=False)
    assert "library_name: peft" in adapter and "AutoPeftModelForCausalLM" in adapter
    full = render_model_card(_source(tmp_path, "full"), {}, merged=False)
    assert "full-finetune" in full and "(full fine-tuning)" in full
    assert base_model_id("org/model") == "org/model"


def test_an_encoder_decoder_card_loads_with_the_seq2seq_classes(tmp_path: Path) -> None:
    model_dir = tmp_path / "t5"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "t5", "is_encoder_decoder": true}')
    source = _source(tmp_path, "full")
    seq2seq = dataclasses.replace(source, model=ModelConfig(name=str(model_dir)))
    full = render_model_card(seq2seq, {}, merged=False)
    assert "AutoModelForSeq2SeqLM.from_pretrained" in full and "AutoModelForCausalLM" not in full
    lora = dataclasses.replace(seq2seq, kind="lora")
    assert "AutoPeftModelForSeq2SeqLM" in render_model_card(lora, {}, merged=False)


def test_card_states_the_gates_it_passed(tmp_path: Path) -> None:
    from rayft.evaluation.summary import GateResult

    evidence = "tuned - base accuracy +0.150 [+0.105, +0.200], n=200; mcnemar p=3e-08 (needs < 0.05)"
    card = render_model_card(_source(tmp_path), {}, merged=True, gates=[GateResult("tuned > base", True, evidence)])
    assert "## Evidence\n\nThis model was exported after it passed these promotion gates" in card
    assert f"- `tuned > base`: {evidence}\n" in card
    assert card.index("## Evidence") < card.index("## Verification")
    assert "## Evidence" not in render_model_card(_source(tmp_path), {}, merged=True)
