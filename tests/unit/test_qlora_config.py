"""Where QLoRA cannot apply it is refused with the reason, and a missing bitsandbytes names its install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.errors import ConfigError, ModelError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.method=full"], "quantized weights cannot be trained; set train.method=lora"),
        (["train.strategy=fsdp"], r"cannot be sharded or offloaded \(FSDP, DeepSpeed ZeRO-3\); set train.strategy=ddp"),
        (["train.strategy=deepspeed"], "cannot be sharded or offloaded"),
    ],
)
def test_qlora_is_refused_where_it_cannot_apply(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["lora.quantize=nf4", *overrides])


def test_a_missing_bitsandbytes_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from rayft.models.loading import quantization

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ModelError, match=r"lora.quantize='nf4' needs bitsandbytes: pip install 'rayft\[qlora\]'"):
        quantization("nf4", "cpu")


def test_quantized_embeddings_are_refused_without_a_quantized_base() -> None:
    with pytest.raises(
        ConfigError, match=r"lora.quantize_embeddings=true .* lora.quantize is 'none': set lora.quantize=nf4"
    ):
        load_config(None, ["lora.quantize_embeddings=true"])
    assert load_config(None, ["lora.quantize=nf4", "lora.quantize_embeddings=true"]).lora.quantize_embeddings


@pytest.mark.parametrize("trained", ["lm_head", "embed_tokens"])
def test_a_quantized_embedding_or_head_cannot_also_be_trained_in_full(tmp_path: Path, trained: str) -> None:
    pytest.importorskip("bitsandbytes", reason="QLoRA needs the qlora extra: pip install 'rayft[qlora]'")
    from rayft.config import LoraConfig, ModelConfig
    from rayft.testing import build_tiny_model
    from rayft.training.modeling.model import build_training_model

    model_dir = build_tiny_model(tmp_path, hidden_size=64)
    lora = LoraConfig(quantize="nf4", quantize_embeddings=True, modules_to_save=[trained])
    with pytest.raises(ModelError, match=rf"lora.modules_to_save=\['{trained}'\] trains the embedding or head in full"):
        build_training_model(ModelConfig(name=str(model_dir)), lora, "lora", "cpu", gradient_checkpointing=False,
                             restore_dir=None)  # fmt: skip
