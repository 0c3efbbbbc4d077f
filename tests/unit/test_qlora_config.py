"""Where QLoRA cannot apply it is refused with the reason, and a missing bitsandbytes names its install."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
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


HIDDEN_IN_A_WORKER = """
import importlib.util, sys
import torch
from rayft.config.model import LoraConfig, ModelConfig
from rayft.models.loading import hide_unused_bitsandbytes, load_causal_lm
from rayft.training.modeling.model import prepare_training_model

cfg = ModelConfig(name=sys.argv[1])
assert importlib.util.find_spec("bitsandbytes") is not None  # installed
assert hide_unused_bitsandbytes(cfg, "none")
net = prepare_training_model(load_causal_lm(cfg), LoraConfig(r=4), "lora", "sdpa", "cpu",
                             gradient_checkpointing=False, compile_blocks=False)
from peft.import_utils import is_bnb_available
from transformers.utils import is_bitsandbytes_available
net(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
loaded = sorted(m for m, v in sys.modules.items() if m.startswith("bitsandbytes") and v)
print(is_bnb_available(), is_bitsandbytes_available(), loaded)
"""


def test_a_worker_that_loads_no_quantized_model_trains_lora_without_bitsandbytes(tiny_model_dir: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="the qlora extra: pip install 'rayft[qlora]'")

    # A fresh interpreter: the hiding lasts for the process.
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN_IN_A_WORKER, str(tiny_model_dir)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "False False []"  # PEFT and transformers see it absent; never imported


def test_bitsandbytes_stays_for_a_quantized_base_a_quantized_checkpoint_or_once_imported(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayft.config.model import ModelConfig
    from rayft.models.loading import hide_unused_bitsandbytes

    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)  # restored after the test
    assert not hide_unused_bitsandbytes(ModelConfig(name=str(tiny_model_dir)), "nf4")
    saved = shutil.copytree(tiny_model_dir, tmp_path / "saved-in-4-bit")
    config = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "bitsandbytes"}}))
    assert not hide_unused_bitsandbytes(ModelConfig(name=str(saved)), "none")
    assert "bitsandbytes" not in sys.modules
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    assert not hide_unused_bitsandbytes(ModelConfig(name=str(tiny_model_dir)), "none")
    assert sys.modules["bitsandbytes"] is not None


def _model_config(directory: Path, hidden: int, ffn: int) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden,
                                                       "intermediate_size": ffn}))  # fmt: skip
    return directory


def test_qlora_on_widths_that_are_not_multiples_of_64_is_refused_before_training(tmp_path: Path) -> None:
    from rayft.models.architecture import refuse_quantize_widths
    from rayft.recipes.train import run

    narrow = _model_config(tmp_path / "narrow", 96, 256)
    cfg = load_config(None, [f"model.name={narrow}", "lora.quantize=nf4", f"storage_path={tmp_path / 'runs'}"])
    rule = (
        r"lora.quantize='nf4': model.name='.*narrow' has hidden_size=96, and bitsandbytes' quantized linear "
        r"layers need input widths that are multiples of 64; use a model whose widths are, or lora.quantize=none"
    )
    with pytest.raises(ConfigError, match=rule):
        run(cfg)
    assert not (tmp_path / "runs").exists()  # refused before the run directory
    refuse_quantize_widths(cfg.model, "none")  # no quantization: no rule
    wide = _model_config(tmp_path / "wide", 128, 512)
    refuse_quantize_widths(cfg.model.model_copy(update={"name": str(wide)}), "int8")
