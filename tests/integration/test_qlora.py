"""QLoRA: a LoRA adapter trained on a base quantized by bitsandbytes (its CPU kernels), its loss falling,
then exported merged into the base in its own dtype, reloaded and generating; the same with the tied
embedding and head quantized too; and DPO on a quantized base, whose reference is that base with the
adapter off."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.data.prepared import PreparedData
from tests.integration.test_train_preference import pair_config, write_pairs
from tests.support.runs import adapter_tensors, read_metrics, tiny_config, train_losses, train_on

pytestmark = pytest.mark.integration
pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")


@pytest.mark.parametrize(("quantize", "tables"), [("nf4", False), ("int8", False), ("nf4", True), ("int8", True)])
def test_qlora_trains_and_its_merged_export_loads_and_generates(
    qlora_model_dir: Path, qlora_units: PreparedData, tmp_path: Path, quantize: str, tables: bool
) -> None:
    from rayft.recipes.export import export_model

    cfg = tiny_config(qlora_model_dir, tmp_path / "runs", "scaling.num_workers=0", "train.max_steps=12",
                      "train.learning_rate=1e-2", "train.eval_steps=100", "train.save_steps=100",
                      f"lora.quantize={quantize}", f"lora.quantize_embeddings={str(tables).lower()}",
                      "lora.r=8")  # fmt: skip
    run_dir = train_on(cfg, qlora_units)
    losses = train_losses(run_dir)
    assert max(losses) == 12 and sum(list(losses.values())[-3:]) < sum(list(losses.values())[:3]), losses
    adapter = adapter_tensors(run_dir / "final")
    assert adapter and all(str(t.dtype) == "torch.float32" for t in adapter.values())  # the adapter is not quantized

    export_cfg = load_config(None, [f"model.name={qlora_model_dir}"])
    result = export_model(export_cfg, str(run_dir), tmp_path / "merged")
    assert result.merged and result.verification["reload_generate_ok"] is True
    assert result.verification["adapter_effect_max_abs_logit"] > 0
    assert (result.output_dir / "model.safetensors").is_file()
    assert_tied_in_file(result.output_dir / "model.safetensors")


def assert_tied_in_file(weights: Path) -> None:
    """The tiny model ties its head to its embedding; the merged export keeps the tie: one stored table,
    which a reloaded model reads as both."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(str(weights), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    model = AutoModelForCausalLM.from_pretrained(weights.parent)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


# Two Ray Train workers: DDP broadcasts rank 0's quantized weights and tables (uint8 buffers) as it wraps.
@pytest.mark.parametrize(("quantize", "tables", "workers"), [("nf4", False, 0), ("int8", True, 0), ("nf4", True, 2)])
def test_dpo_on_a_quantized_base_starts_at_ln2_and_its_loss_falls(
    ray_session: None, qlora_model_dir: Path, tmp_path: Path, *, quantize: str, tables: bool, workers: int
) -> None:
    from rayft.training.driver.startup import prepare_training_data

    pairs = write_pairs(tmp_path / "pairs.jsonl", 64)
    cfg = pair_config(qlora_model_dir, tmp_path / "runs", pairs, f"scaling.num_workers={workers}",
                      f"lora.quantize={quantize}", f"lora.quantize_embeddings={str(tables).lower()}",
                      "train.save_steps=100")  # fmt: skip
    run_dir = train_on(cfg, prepare_training_data(cfg, None, use_ray=True))
    losses = train_losses(run_dir)
    assert list(losses) == list(range(1, 7))
    # The adapter starts at zero: the policy is the quantized base with the adapter on, the reference with it off.
    # Its zero output adds exactly 0, so the margins are exactly 0 and the loss is float32's -log sigmoid(0):
    # ln 2 within a few roundings of 2**-24 (abs 1e-6 is ~16 of them).
    assert losses[1] == pytest.approx(math.log(2), abs=1e-6)
    assert losses[6] < losses[1] - 0.05, losses
    last = next(r for r in read_metrics(run_dir) if r.get("step") == 6 and "train/loss" in r)
    assert last["rewards/margins"] > 0
