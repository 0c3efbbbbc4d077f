"""SFT with a KL penalty to the base model (``train.objective: sft_kl``) as a training method.

The model, its batches, files and validation figures are :class:`~rayft.training.loop.objective.CausalLm`'s:
supervised examples, one loss term per label token. The loss adds to each token's cross-entropy ``beta``
times KL(policy || base) at that position (:mod:`.losses`); the base is the model with its LoRA adapter off,
or, for full fine-tuning, a frozen copy loaded at start. Validation reports the plain next-token loss, which
ranks checkpoints as SFT's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rayft.config.sft_kl import SftKlConfig
from rayft.data.collate import MicroBatch
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError
from rayft.training.loop.batches import TrainBatch, Unit
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.session import all_reduce_sum
from rayft.training.methods.sft_kl.losses import kl_sft_loss
from rayft.training.modeling.model import unwrap

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

    from rayft.training.modeling.precision import Precision

FIGURES = ("nll", "kl", "tokens")


@dataclass
class KlSftTraining(MethodHooks):
    """The :class:`~rayft.training.loop.method.Method` of KL-regularised SFT."""

    lm: CausalLm
    settings: SftKlConfig
    reference_model: torch.nn.Module | None = None  # the frozen copy of full fine-tuning
    sums: dict[str, float] = field(default_factory=dict)  # this rank's figure sums since the last figures()
    throughput_unit: str = "tokens"

    @classmethod
    def build(cls, lm: CausalLm) -> KlSftTraining:
        """The method around the run's causal LM."""
        if lm.seq2seq:
            raise ConfigError("train.objective=sft_kl trains a causal LM; model.name is an encoder-decoder")
        return cls(lm, lm.plan.train.sft_kl)

    @property
    def model_type(self) -> str:
        """The base model's type, for the precision checks."""
        return self.lm.model_type

    @property
    def full(self) -> bool:
        """Whether every weight trains (the base is then a frozen copy)."""
        return self.lm.plan.train.method == "full"

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The model :class:`CausalLm` builds, and for full fine-tuning the frozen copy of the base."""
        model = self.lm.build_model(restore_dir, device_type=device_type, weights=weights)
        if self.full:
            from rayft.models.loading import load_causal_lm

            reference: torch.nn.Module = load_causal_lm(self.lm.plan.model, device_type)
            self.reference_model = reference.eval().requires_grad_(False)
        return model

    def collate(self, units: list[Unit]) -> MicroBatch:
        """Token units padded into one micro-batch (as SFT's)."""
        return self.lm.collate(units)

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The sum over the label tokens of cross-entropy plus ``beta`` times the KL term."""
        assert isinstance(batch, MicroBatch)  # the loop trains on what collate() made
        import torch

        targets, keep = kept_targets(batch)
        logits = self.logits(model, batch, keep, precision)
        with torch.no_grad():
            ref_logits = self.reference_logits(model, batch, keep, precision)
        result = kl_sft_loss(logits, ref_logits, targets, self.settings.beta)
        self.add("nll", result.nll_sum)
        self.add("kl", result.kl_sum)
        self.add("tokens", float(batch.num_label_tokens))
        return result.loss_sum

    def logits(self, model: torch.nn.Module, rows: MicroBatch, keep: torch.Tensor, precision: Precision | None
               ) -> torch.Tensor:  # fmt: skip
        """``model``'s logits at the kept positions (``logits_to_keep``: prompts skip the vocabulary projection)."""
        import torch

        dtype = precision.autocast_dtype if precision is not None else None
        autocast = (torch.autocast(device_type=rows.input_ids.device.type, dtype=dtype) if dtype is not None
                    else contextlib.nullcontext())  # fmt: skip
        with autocast:
            out = model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False, logits_to_keep=keep)
        return cast("torch.Tensor", out.logits)

    def reference_logits(self, model: torch.nn.Module, rows: MicroBatch, keep: torch.Tensor, precision: Precision
                         ) -> torch.Tensor:  # fmt: skip
        """The base model's logits: the frozen copy (kept in fp32), or the model with its adapter off."""
        if self.reference_model is not None:
            return self.logits(self.reference_model.to(rows.input_ids.device), rows, keep, None)
        with cast("PeftModel", unwrap(model)).disable_adapter():
            return self.logits(model, rows, keep, precision)

    def add(self, name: str, value: float) -> None:
        """Add ``value`` to this rank's sum of ``name`` since the last figures."""
        self.sums[name] = self.sums.get(name, 0.0) + value

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """Every rank's mean cross-entropy and KL per label token since the last call, and reset."""
        nll, kl, tokens = all_reduce_sum([self.sums.get(name, 0.0) for name in FIGURES], device)
        self.sums.clear()
        return {"sft_kl/nll": nll / max(tokens, 1.0), "sft_kl/kl": kl / max(tokens, 1.0)}

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """SFT's validation loss and perplexity."""
        return self.lm.evaluate(model, units, batch_size=batch_size, precision=precision, device=device,
                                lockstep=lockstep)  # fmt: skip

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """The files :class:`CausalLm` writes."""
        self.lm.write_model(model, directory, state_dict)


def kept_targets(rows: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token targets at the positions some row trains on, and those positions."""
    targets = rows.labels[:, 1:]
    keep = (targets != IGNORE_INDEX).any(dim=0).nonzero().flatten()
    return targets[:, keep], keep
