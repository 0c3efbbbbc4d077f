"""Checkpoint saving from the objects it needs alone (no training loop, no Ray): a save through a
local session commits a checkpoint that restores the optimizer, scheduler and loop state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def _trained_lora(model_dir: Path) -> tuple[Any, Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    ids = torch.arange(3, 11).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


@pytest.mark.parametrize("background", [False, True])
def test_a_checkpoint_saved_from_its_objects_restores_them(
    tiny_model_dir: Path, tmp_path: Path, background: bool
) -> None:
    import torch
    from transformers import AutoTokenizer

    from rayft.runs.manifest import read_manifest
    from rayft.training.checkpointing import (
        Checkpointer,
        ModelFiles,
        TrainerState,
        TrainingObjects,
        restore_training_state,
        write_model_files,
    )
    from rayft.training.faults import Faults
    from rayft.training.session import LocalSession
    from rayft.training.strategies import parallelism

    model, optimizer, scheduler = _trained_lora(tiny_model_dir)
    parallel = parallelism("ddp", world_size=1)
    files = ModelFiles("lora", 4, "train:\n  method: lora\n", {"method": "lora", "world_size": 1})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def write_model(model: object, directory: Path, state: dict[str, object] | None) -> None:
        write_model_files(model, tokenizer, files, directory, state_dict=state)

    saver = Checkpointer(
        LocalSession({}, tmp_path, device="cpu"), files, write_model, faults=Faults(), background=background
    )
    state = TrainerState(step=1, last_train_loss=2.5)
    saver.save(TrainingObjects(parallel, model, optimizer, scheduler), state)
    saver.wait()

    saved = tmp_path / "checkpoints" / "step-000001"
    manifest = read_manifest(saved)
    assert manifest is not None and manifest.step == 1 and manifest.info == files.lineage
    assert manifest.metrics == {"step": 1.0, "train/loss": 2.5}
    assert (saved / "adapter_model.safetensors").is_file() and state.checkpoint_blocked_s > 0

    fresh, fresh_optimizer, fresh_scheduler = _trained_lora(tiny_model_dir)
    for group in fresh_optimizer.state.values():
        group["exp_avg"].zero_()
    restored = restore_training_state(saved, parallel, fresh, fresh_optimizer, fresh_scheduler, rank=0)
    assert restored.step == 1 and restored.last_train_loss == 2.5
    assert fresh_scheduler.state_dict() == json.loads(json.dumps(scheduler.state_dict()))
    for before, after in zip(optimizer.state.values(), fresh_optimizer.state.values(), strict=True):
        assert torch.equal(before["exp_avg"], after["exp_avg"])
