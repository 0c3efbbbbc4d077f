"""Encoder-decoder models on the tiny random T5: detection from the config (and the override),
source/target units with every target token trained, length limits, packing and fp16 refused,
LoRA targets named per family, and the pair loss equal to transformers' own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rayft.config import ModelConfig, load_config
from rayft.config.schema import RayftConfig
from rayft.data.prepare import prepare_data
from rayft.data.prepared import IGNORE_INDEX, PreparedData
from rayft.errors import ConfigError, DataError
from rayft.models.architecture import lora_targets, refuse_fp16, resolve_architecture

WIKISQL_LIKE = [
    {
        "instruction": "Write the SQL query.",
        "input": f"Which name has age {i}?",
        "output": f"SELECT name WHERE age = {i}",
    }
    for i in range(20)
]


def _config(model_dir: Path, data: Path, *overrides: str) -> RayftConfig:
    return load_config(None, [f"model.name={model_dir}", f"data.datasets=[{{path: {data}}}]",
                              "data.validation_fraction=0", *overrides])  # fmt: skip


def _units(prepared: PreparedData) -> list[dict[str, Any]]:
    return [row for f in prepared.train.files for row in pq.read_table(f).to_pylist()]


@pytest.fixture
def wikisql(tmp_path: Path) -> Path:
    path = tmp_path / "wikisql.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in WIKISQL_LIKE))
    return path


def test_architecture_is_read_from_the_config_and_can_be_overridden(tiny_t5_dir: Path, tiny_model_dir: Path) -> None:
    assert resolve_architecture(ModelConfig(name=str(tiny_t5_dir))) == "seq2seq"
    assert resolve_architecture(ModelConfig(name=str(tiny_model_dir))) == "causal"
    assert resolve_architecture(ModelConfig(name="smollm2-135m-instruct")) == "causal"  # nothing converted
    assert resolve_architecture(ModelConfig(name=str(tiny_t5_dir), architecture="causal")) == "causal"
    with pytest.raises(ValueError, match="architecture"):
        ModelConfig(name="x", architecture="encoder")  # type: ignore[arg-type]


def test_source_and_target_units_train_every_target_token(tiny_t5_dir: Path, wikisql: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_t5_dir)
    eos = tokenizer.eos_token_id
    cfg = _config(tiny_t5_dir, wikisql)
    prepared = prepare_data(cfg.data, cfg.model, 0, report_dir=tmp_path, use_ray=False)

    assert prepared.seq2seq and prepared.train.num_units == 20
    unit = next(u for u in _units(prepared) if tokenizer.decode(u["labels"]) == "SELECT name WHERE age = 3<|im_end|>")
    # No chat template: the source is the plain prompt (instruction, blank line, input).
    assert tokenizer.decode(unit["input_ids"]) == "Write the SQL query.\n\nWhich name has age 3?<|im_end|>"
    assert unit["input_ids"][-1] == unit["labels"][-1] == eos and IGNORE_INDEX not in unit["labels"]
    assert unit["num_tokens"] == len(unit["input_ids"]) + len(unit["labels"])
    assert unit["num_label_tokens"] == len(unit["labels"])

    cut = _config(tiny_t5_dir, wikisql, "data.max_source_length=6", "data.max_target_length=4")
    units = _units(prepare_data(cut.data, cut.model, 0, report_dir=None, use_ray=False))
    assert max(len(u["input_ids"]) for u in units) == 6 and max(len(u["labels"]) for u in units) == 4

    drop = _config(
        tiny_t5_dir, wikisql, "data.max_target_length=4", "data.overlong=drop", "data.max_rejected_fraction=1"
    )
    dropped = prepare_data(drop.data, drop.model, 0, report_dir=tmp_path / "drop", use_ray=False)
    assert dropped.train.num_units == 0 and dropped.stats["rejected_by_reason"] == {"over_length": 20}
    rejected = [json.loads(line) for line in (tmp_path / "drop" / "rejected.jsonl").read_text().splitlines()]
    assert "max_target_length 4" in rejected[0]["detail"]


def test_packing_and_text_rows_are_refused_for_an_encoder_decoder(tiny_t5_dir: Path, wikisql: Path) -> None:
    packed = _config(tiny_t5_dir, wikisql, "data.packing=true")
    with pytest.raises(ConfigError, match=r"data.packing=true: .* is an encoder-decoder .* set data.packing=false"):
        prepare_data(packed.data, packed.model, 0, report_dir=None, use_ray=False)
    text = wikisql.with_name("text.jsonl")
    text.write_text('{"text": "SELECT 1"}\n')
    with pytest.raises(DataError, match="format 'text' .* no prompt to feed an encoder-decoder"):
        cfg = _config(tiny_t5_dir, text)
        prepare_data(cfg.data, cfg.model, 0, report_dir=None, use_ray=False)


def test_float16_is_refused_for_t5_with_the_reason(tiny_t5_dir: Path, tiny_model_dir: Path) -> None:
    from rayft.models.architecture import check_float16

    t5 = ModelConfig(name=str(tiny_t5_dir))
    with pytest.raises(ConfigError, match=r"train.mixed_precision=fp16 .* t5 models overflow in float16 .* use bf16"):
        refuse_fp16(t5, "fp16")
    with pytest.raises(ConfigError, match="model.dtype=float16"):
        refuse_fp16(t5.model_copy(update={"dtype": "float16"}), "bf16")
    with pytest.raises(ConfigError, match="resolves to fp16"):
        check_float16("t5", "train.mixed_precision resolves to fp16 on this GPU")
    refuse_fp16(t5, "bf16")
    refuse_fp16(ModelConfig(name=str(tiny_model_dir)), "fp16")  # a Llama takes fp16


def test_lora_targets_name_each_family_s_linear_layers(tiny_t5_dir: Path) -> None:
    from rayft.config.model import LoraConfig
    from rayft.training.modeling.model import build_training_model

    net = build_training_model(ModelConfig(name=str(tiny_t5_dir)), LoraConfig(r=4), "lora", "cpu",
                               gradient_checkpointing=False, restore_dir=None)  # fmt: skip
    peft_cfg = net.peft_config["default"]
    assert set(peft_cfg.target_modules) == {"q", "k", "v", "o", "wi_0", "wi_1", "wo"}  # gated T5 v1.1
    assert peft_cfg.task_type == "SEQ_2_SEQ_LM"
    bart = ["model.encoder.layers.0.self_attn.q_proj", "model.encoder.layers.0.self_attn.out_proj",
            "model.decoder.layers.0.fc1", "model.decoder.layers.0.fc2", "model.decoder.layers.0.self_attn.k_proj",
            "model.decoder.layers.0.self_attn.v_proj"]  # fmt: skip
    assert lora_targets("bart", bart, "all-linear") == ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
    assert lora_targets("t5", ["encoder.block.0.layer.1.DenseReluDense.wi"], "all-linear") == ["wi"]
    assert lora_targets("t5", [], ["q", "v"]) == ["q", "v"]
    assert lora_targets("llama", [], "all-linear") == "all-linear"


@pytest.mark.numerics  # run under every CPU kernel path by scripts/test_kernels.py
def test_pair_batches_pad_apart_and_their_loss_is_transformers_own(tiny_t5_dir: Path) -> None:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from rayft.data.collate import collate
    from rayft.training.loop.steps import pair_loss_sum
    from rayft.training.modeling.precision import Precision

    units = [
        {"input_ids": [5, 6, 7, 2], "labels": [8, 2], "sample_ids": [0], "num_tokens": 6},
        {"input_ids": [9, 2], "labels": [10, 11, 12, 2], "sample_ids": [1], "num_tokens": 6},
    ]
    batch = collate(units, pad_token_id=3, seq2seq=True)
    assert batch.input_ids.tolist() == [[5, 6, 7, 2], [9, 2, 3, 3]]
    assert batch.attention_mask is not None and batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch.labels.tolist() == [[8, 2, IGNORE_INDEX, IGNORE_INDEX], [10, 11, 12, 2]]
    assert (batch.num_tokens, batch.num_label_tokens, batch.num_computed_tokens) == (12, 6, 16)

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_t5_dir).eval()
    with torch.no_grad():
        ours = pair_loss_sum(model, batch, Precision(None, False))
        theirs = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
    # transformers' own loss against ours: the same float32 forward, the cross-entropy summed then divided
    # (ours) or averaged (theirs): a few roundings of 2**-24 apart; 1e-5 covers any kernel's order.
    assert float(ours) / batch.num_label_tokens == pytest.approx(float(theirs), rel=1e-5)
