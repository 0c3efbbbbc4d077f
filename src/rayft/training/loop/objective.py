"""The causal LM that every language-model method trains: how it is built (or restored), how token units
become a micro-batch, its next-token loss and validation figures, and the model files of a checkpoint.
It is supervised fine-tuning's whole method (``train.objective: sft``); the other methods of
``rayft.training.methods`` train it with batches and losses of their own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.data.collate import MicroBatch, collate, end_to_end
from rayft.training.loop.batches import TrainBatch, Unit, micro_batches
from rayft.training.loop.checkpointing import write_model_files
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.steps import evaluate, step_options, token_loss_sum
from rayft.training.modeling.attention import row_multiple
from rayft.training.modeling.model import build_training_model

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from rayft.training.loop.checkpointing import ModelFiles
    from rayft.training.loop.worker_plan import WorkerPlan
    from rayft.training.modeling.precision import Precision


@dataclass(frozen=True)
class CausalLm(MethodHooks):
    """Fine-tuning ``plan.model`` (LoRA or full) on token units with a next-token loss, or, with
    ``seq2seq``, an encoder-decoder on source/target pairs with the loss on every target token."""

    plan: WorkerPlan
    tokenizer: PreTrainedTokenizerBase
    files: ModelFiles
    model_type: str = ""
    seq2seq: bool = False
    throughput_unit: str = "tokens"

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """:func:`rayft.training.modeling.model.build_training_model` for the plan's model and method."""
        plan = self.plan
        return build_training_model(
            plan.model, plan.lora, plan.train.method, device_type, restore_dir=restore_dir, weights=weights,
            gradient_checkpointing=plan.train.gradient_checkpointing, compile_blocks=plan.train.compile is True,
            liger_kernels=plan.train.liger_kernels, frozen_bf16=plan.train.frozen_precision == "bf16",
        )  # fmt: skip

    def collate(self, units: list[Unit]) -> MicroBatch:
        """Token units padded into one :class:`~rayft.data.collate.MicroBatch`."""
        multiple = row_multiple(self.plan.model.attn_implementation)
        if self.plan.train.padding_free is True and not self.seq2seq:
            units = [end_to_end(units)]
        return collate(units, self.tokenizer.pad_token_id, multiple, seq2seq=self.seq2seq)

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """:func:`rayft.training.loop.steps.token_loss_sum` with the run's loss and attention kernels."""
        assert isinstance(batch, MicroBatch)  # the loop trains on what collate() made
        return token_loss_sum(model, batch, precision, **self._kernels(batch.input_ids.device.type))

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Validation loss and perplexity."""
        batches = (self.collate(chunk) for chunk in micro_batches(iter(units), batch_size))
        loss, _ = evaluate(model, batches, precision=precision, device=device, lockstep=lockstep,
                           seq2seq=self.seq2seq, **self._kernels(device.type))  # fmt: skip
        return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 50.0))}

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Weights or adapter, tokenizer, generation config and resolved config."""
        write_model_files(model, self.tokenizer, self.files, directory, state_dict=state_dict)

    def _kernels(self, device_type: str) -> dict[str, Any]:
        plan = self.plan
        return step_options(plan.model.attn_implementation, plan.train.fused_loss, device_type, seq2seq=self.seq2seq)
