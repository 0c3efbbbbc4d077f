"""The LoRA variants' settings: what the config refuses, what the step line says under DoRA, the adapter
config PEFT receives, and where an adapter that rewrote its base cannot go."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rayft.config import RayftConfig, load_config
from rayft.errors import ConfigError
from rayft.training.modeling.step_choice import StepFacts, StepRequest, choose_step

CPU = StepFacts(
    device_type="cpu", method="lora", hidden_size=576, num_layers=30, vocab_size=49152, seq_length=512,
    micro_batch_size=4, packing=True, free_memory_bytes=12 * 2**30, cpus=2, cpu_bf16=True, torch_version=(2, 13),
)  # fmt: skip


def test_defaults_are_plain_lora() -> None:
    lora = RayftConfig().lora
    assert (lora.use_dora, lora.use_rslora, lora.init) == (False, False, "default")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["lora.init=pissa", "lora.quantize=nf4"], "lora.init='pissa' rewrites the base weights"),
        (["lora.init=olora", "lora.quantize=int8"], "lora.init='olora' rewrites the base weights"),
        (["lora.use_dora=true", "train.frozen_precision=bf16"], "DoRA divides by the norm of the base weight"),
        (["lora.init=svd"], "lora.init"),
    ],
)
def test_the_config_refuses_what_cannot_run(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_dora_keeps_the_frozen_layers_fp32_and_the_step_line_says_why_dropout_is_peft_s() -> None:
    plain = choose_step(StepRequest(), CPU)
    dora = choose_step(StepRequest(), replace(CPU, dora=True))
    assert plain.frozen_precision == "bf16" and dora.frozen_precision == "fp32"
    assert "frozen layers fp32 (DoRA divides by the base weight's norm" in dora.describe()
    assert "LoRA dropout in PEFT's forward (DoRA reads the dropped-out input itself)" in dora.describe()
    assert "LoRA dropout" not in plain.describe()
    assert "LoRA dropout" not in choose_step(StepRequest(), replace(CPU, dora=True, method="full")).describe()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], {"use_dora": False, "use_rslora": False, "init_lora_weights": True}),
        (["lora.use_dora=true"], {"use_dora": True, "use_rslora": False, "init_lora_weights": True}),
        (["lora.use_rslora=true"], {"use_dora": False, "use_rslora": True, "init_lora_weights": True}),
        (["lora.init=pissa"], {"use_dora": False, "use_rslora": False, "init_lora_weights": "pissa"}),
        (["lora.init=olora"], {"use_dora": False, "use_rslora": False, "init_lora_weights": "olora"}),
    ],
)
def test_peft_receives_the_variant(tiny_model_dir: Path, overrides: list[str], expected: dict[str, object]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling.model import prepare_training_model

    lora = load_config(None, ["lora.r=4", *overrides]).lora
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = prepare_training_model(net, lora, "lora", "eager", "cpu", gradient_checkpointing=False,
                                   compile_blocks=False)  # fmt: skip
    config = model.peft_config["default"]
    assert {key: getattr(config, key) for key in expected} == expected
    if lora.use_dora:  # the lean dropout leaves DoRA's layers to PEFT's forward
        from rayft.training.modeling.lora_dropout import DroppedInputLinear

        assert not any(isinstance(m, DroppedInputLinear) for m in model.modules())


def test_an_adapter_off_reference_is_refused_after_a_rewriting_init(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.training.modeling.model import check_adapter_off_is_base, prepare_training_model

    for init, refused in (("default", False), ("pissa", True)):
        lora = load_config(None, ["lora.r=4", f"lora.init={init}"]).lora
        net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = prepare_training_model(net, lora, "lora", "eager", "cpu", gradient_checkpointing=False,
                                       compile_blocks=False)  # fmt: skip
        if not refused:
            check_adapter_off_is_base(model, "DPO's reference")
            continue
        with pytest.raises(ConfigError, match="GRPO's KL reference .* lora.init='pissa' rewrote the base weights"):
            check_adapter_off_is_base(model, "GRPO's KL reference (train.rl.reference base)")


def test_serve_refuses_an_adapter_that_rewrote_its_base(tmp_path: Path) -> None:
    from rayft.serving.plan import _refuse_rewritten_base

    (tmp_path / "adapter_config.json").write_text(json.dumps({"init_lora_weights": "olora"}))
    with pytest.raises(ConfigError, match="tuned: its adapter was initialised by olora .* export it merged"):
        _refuse_rewritten_base("tuned", tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"init_lora_weights": True}))
    _refuse_rewritten_base("tuned", tmp_path)


def test_a_worker_built_on_the_meta_device_records_the_init_it_did_not_run(tiny_model_dir: Path) -> None:
    from rayft.config import ModelConfig
    from rayft.models.loading import empty_causal_lm
    from rayft.training.modeling.model import on_meta, prepare_training_model

    net = empty_causal_lm(ModelConfig(name=str(tiny_model_dir), dtype="float32"))
    lora = load_config(None, ["lora.r=4", "lora.init=pissa"]).lora
    model = prepare_training_model(net, lora, "lora", "eager", "cpu", gradient_checkpointing=False,
                                   compile_blocks=False)  # fmt: skip
    assert on_meta(model)  # nothing to decompose: rank 0's split base and adapter fill it
    assert model.peft_config["default"].init_lora_weights == "pissa"
