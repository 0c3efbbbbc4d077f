"""Builders of small checkpoints and run directories that look exactly like training's output.

They write the layout of :mod:`rayft.runs.layout` (weights, tokenizer with chat template,
generation config, ``rayft_config.yaml`` and the manifest last) in a second, without a training
run. LoRA adapters come from a real PEFT model whose weights are perturbed with a seed, so that
the adapter changes the model's outputs the way a trained one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.config import dump_config, load_config
from rayft.runs import layout
from rayft.runs.manifest import write_manifest
from rayft.training.loop.checkpointing import _generation_config


def _perturb(tensors: Any, seed: int, scale: float) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in tensors:
            tensor.add_(torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * scale)


def _write_common(model: Any, base_model_dir: Path, directory: Path, overrides: Sequence[str]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    _generation_config(model, tokenizer).save_pretrained(directory)
    cfg = load_config(None, [f"model.name={base_model_dir}", *overrides])
    (directory / layout.CHECKPOINT_CONFIG_FILE).write_text(dump_config(cfg), encoding="utf-8")


def build_lora_checkpoint(
    directory: Path,
    base_model_dir: Path,
    *,
    r: int = 4,
    alpha: float = 8.0,
    target_modules: Sequence[str] | str = "all-linear",
    step: int = 2,
    seed: int = 0,
    scale: float = 0.05,
    metrics: dict[str, float] | None = None,
    data_key: str = "test-data",
) -> Path:
    """A LoRA checkpoint of ``base_model_dir`` with seeded non-zero A and B matrices."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    targets: list[str] | str = target_modules if isinstance(target_modules, str) else list(target_modules)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir)
    peft_cfg = LoraConfig(r=r, lora_alpha=int(alpha), target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(base, peft_cfg)
    _perturb([p for n, p in model.named_parameters() if "lora_" in n], seed, scale)
    directory.mkdir(parents=True, exist_ok=True)
    target_override = targets if isinstance(targets, str) else "[" + ",".join(targets) + "]"
    overrides = ["train.method=lora", f"lora.r={r}", f"lora.alpha={alpha}", f"lora.target_modules={target_override}"]
    _write_common(model, base_model_dir, directory, overrides)
    info = {"method": "lora", "base_model": str(base_model_dir), "data_key": data_key}
    write_manifest(directory, step, metrics or {"train/loss": 1.0}, info)
    return directory


def build_full_checkpoint(
    directory: Path,
    base_model_dir: Path,
    *,
    step: int = 2,
    seed: int = 0,
    scale: float = 0.01,
    metrics: dict[str, float] | None = None,
    data_key: str = "test-data",
) -> Path:
    """A full fine-tuning checkpoint: every weight of ``base_model_dir`` perturbed with a seed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir)
    _perturb(list(model.parameters()), seed, scale)
    directory.mkdir(parents=True, exist_ok=True)
    _write_common(model, base_model_dir, directory, ["train.method=full"])
    info = {"method": "full", "base_model": str(base_model_dir), "data_key": data_key}
    write_manifest(directory, step, metrics or {"train/loss": 1.0}, info)
    return directory


def build_run_dir(
    run_dir: Path,
    base_model_dir: Path,
    *,
    eval_losses: dict[int, float | None],
    final: bool = True,
    method: str = "lora",
) -> Path:
    """A run directory with ``checkpoints/step-N`` for every step of ``eval_losses`` and ``final/``
    (a copy of the last step's weights), each with its manifest."""
    build = build_lora_checkpoint if method == "lora" else build_full_checkpoint
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, [f"model.name={base_model_dir}", f"train.method={method}", f"name={run_dir.name}"])
    (run_dir / layout.CONFIG_FILE).write_text(dump_config(cfg), encoding="utf-8")
    for step, loss in sorted(eval_losses.items()):
        metrics = {"train/loss": 1.0} | ({"eval/loss": loss} if loss is not None else {})
        build(run_dir / layout.CHECKPOINTS_DIR / layout.step_dir_name(step), base_model_dir, step=step, seed=step,
              metrics=metrics)  # fmt: skip
    if final and eval_losses:
        last = max(eval_losses)
        loss = eval_losses[last]
        metrics = {"train/loss": 1.0} | ({"eval/loss": loss} if loss is not None else {})
        build(run_dir / layout.FINAL_DIR, base_model_dir, step=last, seed=last, metrics=metrics)
    return run_dir
