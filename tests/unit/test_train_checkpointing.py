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

    from rayft.runs.location import RunLocation
    from rayft.runs.manifest import read_manifest
    from rayft.training.loop.checkpointing import (
        Checkpointer,
        ModelFiles,
        TrainerState,
        TrainingObjects,
        restore_training_state,
        write_model_files,
    )
    from rayft.training.loop.session import LocalSession
    from rayft.training.strategies.table import parallelism

    model, optimizer, scheduler = _trained_lora(tiny_model_dir)
    parallel = parallelism("ddp", world_size=1)
    files = ModelFiles("lora", 4, "train:\n  method: lora\n", {"method": "lora", "world_size": 1})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def write_model(model: object, directory: Path, state: dict[str, object] | None) -> None:
        write_model_files(model, tokenizer, files, directory, state_dict=state)

    saver = Checkpointer(
        LocalSession({}, RunLocation(tmp_path), device="cpu"), files, write_model, background=background
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


def _lora_saver(model_dir: Path, run_dir: Path, *, background: bool = False) -> tuple[Any, Any, Any]:
    from transformers import AutoTokenizer

    from rayft.runs.location import RunLocation
    from rayft.training.loop.checkpointing import Checkpointer, ModelFiles, TrainingObjects, write_model_files
    from rayft.training.loop.session import LocalSession
    from rayft.training.strategies.table import parallelism

    model, optimizer, scheduler = _trained_lora(model_dir)
    files = ModelFiles("lora", 4, "train:\n  method: lora\n", {"method": "lora", "world_size": 1})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def write_model(model: object, directory: Path, state: dict[str, object] | None) -> None:
        write_model_files(model, tokenizer, files, directory, state_dict=state)

    saver = Checkpointer(
        LocalSession({}, RunLocation(run_dir), device="cpu"), files, write_model, background=background
    )
    return saver, TrainingObjects(parallelism("ddp", world_size=1), model, optimizer, scheduler), files


def test_every_file_of_a_checkpoint_has_the_mode_of_a_new_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    """safetensors writes the weights through a private temporary file (0600): they get the mode of
    the rest (0644 under umask 022), so a group that reads the run reads its weights too."""
    from rayft.training.loop.checkpointing import TrainerState

    saver, objects, _ = _lora_saver(tiny_model_dir, tmp_path)
    saver.save(objects, TrainerState(step=1))
    saver.wait()
    (tmp_path / "plain").touch()
    expected = (tmp_path / "plain").stat().st_mode & 0o777
    saved = tmp_path / "checkpoints" / "step-000001"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in saved.iterdir() if p.is_file()}
    assert set(modes.values()) == {oct(expected)}, modes


@pytest.mark.parametrize("background", [False, True])
def test_a_full_disk_names_the_place_and_the_checkpoint_kept(tiny_model_dir: Path, tmp_path: Path,
                                                            background: bool) -> None:  # fmt: skip
    """A real full filesystem (a tmpfs with room for one checkpoint): the second save fails with the
    mount point and the checkpoint kept, not torch's ``basic_ios::clear: iostream error``."""
    from rayft.errors import StorageError
    from rayft.training.loop.checkpointing import TrainerState
    from tests.support.mounts import tmpfs

    saver, objects, _ = _lora_saver(tiny_model_dir, tmp_path / "probe")
    saver.save(objects, TrainerState(step=1))
    saver.wait()
    one = sum(p.stat().st_size for p in (tmp_path / "probe").rglob("*") if p.is_file())
    with tmpfs(tmp_path / "disk", size_kib=one * 3 // 2 // 1024 + 8) as disk:
        saver, objects, _ = _lora_saver(tiny_model_dir, disk, background=background)
        saver.save(objects, TrainerState(step=1))
        saver.wait()
        with pytest.raises(StorageError) as raised:
            saver.save(objects, TrainerState(step=2))
            saver.wait()
        message = str(raised.value)
        assert message.startswith(f"no space left on {disk} while writing .step-000002.partial-"), message
        assert f"kept: the newest complete checkpoint {disk / 'checkpoints' / 'step-000001'}" in message
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["step-000001"]  # partial write gone
