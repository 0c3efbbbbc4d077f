"""A Bradley-Terry reward model (``train.objective: reward_model``) as a training method.

The model is the run's causal LM loaded as a transformers sequence classifier with one output
(``AutoModelForSequenceClassification``, ``num_labels=1``): the base's blocks and a fresh linear score head,
read at each row's last token that is not padding (the classifier's own pooling, so that the saved model
scores a conversation as training did). LoRA trains the adapter and the whole score head (PEFT's SEQ_CLS
adapter, which saves the head beside the adapter); full fine-tuning trains every weight.

A training unit is one preference pair (:mod:`rayft.data.preference`): its chosen and rejected rows go
through the model as one micro-batch, chosen rows first, and each pair is one loss term
(:mod:`.losses`), so every update is the mean loss over the step's pairs whatever the split into workers.
Validation reports the mean loss and the share of held-out pairs whose chosen response out-scores the
rejected one (``eval/pair_accuracy``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config.reward_model import RewardModelTrainConfig
from rayft.data.collate import MicroBatch, collate
from rayft.errors import ConfigError
from rayft.training.loop.batches import OnRows, TrainBatch, Unit, micro_batches
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.session import all_reduce_sum, take_means
from rayft.training.methods.reward_model.losses import FIGURES, PairScores, bradley_terry_losses, figure_sums
from rayft.training.modeling.model import prepare_training_model, training_dtype, unwrap

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from rayft.training.modeling.precision import Precision


@dataclass
class PairRows(OnRows):
    """A micro-batch of pairs: ``rows`` holds every chosen row, then every rejected row."""

    rows: MicroBatch
    pairs: int

    @property
    def num_label_tokens(self) -> int:
        """Loss terms: the pairs."""
        return self.pairs

    def to(self, device: torch.device) -> PairRows:
        """The same batch with its tensors on ``device``."""
        return PairRows(self.rows.to(device), self.pairs)


def collate_pairs(units: Sequence[Unit], pad_token_id: int, pad_to_multiple_of: int = 1) -> PairRows:
    """Pair units (``chosen_input_ids``, ``chosen_labels``, ``rejected_*``, ``sample_ids``) as one
    right-padded micro-batch of rows, chosen first."""
    sides = []
    for side in ("chosen", "rejected"):
        for unit in units:
            ids = list(unit[f"{side}_input_ids"])
            sides.append({"input_ids": ids, "labels": list(unit[f"{side}_labels"]), "position_ids": range(len(ids)),
                          "sample_ids": unit["sample_ids"] if side == "chosen" else []})  # fmt: skip
    return PairRows(collate(sides, pad_token_id, pad_to_multiple_of), len(units))


def pair_scores(model: torch.nn.Module, rows: MicroBatch, precision: Precision | None) -> PairScores:
    """The classifier's score of every row, as chosen and rejected halves (float32)."""
    import torch

    dtype = precision.autocast_dtype if precision is not None else None
    autocast = (torch.autocast(device_type=rows.input_ids.device.type, dtype=dtype) if dtype is not None
                else contextlib.nullcontext())  # fmt: skip
    with autocast:
        logits = model(input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False).logits
    scores = logits.float().squeeze(-1)
    half = scores.shape[0] // 2
    return PairScores(scores[:half], scores[half:])


def load_classifier(lm: CausalLm, restore_dir: Path | None, device_type: str) -> PreTrainedModel:
    """The run's base model as a sequence classifier with one output and the tokenizer's pad token (or, for
    full fine-tuning resumed from ``restore_dir``, the classifier saved there). The score head of a fresh
    one is initialised from the worker's seeded generator."""
    from transformers import AutoModelForSequenceClassification

    from rayft.models.loading import loaded_attention, model_location, resolve_dtype

    plan = lm.plan
    location, kwargs = model_location(plan.model)
    if restore_dir is not None and plan.train.method == "full":
        location, kwargs = str(restore_dir), {k: v for k, v in kwargs.items() if k == "trust_remote_code"}
    dtype = resolve_dtype(training_dtype(plan.model, plan.train.method, device_type), device_type)
    loaded: PreTrainedModel = AutoModelForSequenceClassification.from_pretrained(
        location, num_labels=1, pad_token_id=lm.tokenizer.pad_token_id, dtype=dtype,
        attn_implementation=loaded_attention(plan.model.attn_implementation), **kwargs,
    )  # fmt: skip
    return loaded


@dataclass
class RewardModelTraining(MethodHooks):
    """The :class:`~rayft.training.loop.method.Method` of a Bradley-Terry reward model: the tokenizer, model
    source, LoRA settings and files are the run's :class:`CausalLm`'s; the head, batches and loss are its own."""

    lm: CausalLm
    settings: RewardModelTrainConfig
    sums: dict[str, Any] = field(default_factory=dict)  # 0-d tensors since the last figures(), this rank's
    throughput_unit: str = "tokens"

    @classmethod
    def build(cls, lm: CausalLm) -> RewardModelTraining:
        """The method around the run's causal LM; ConfigError for what a reward model does not train on."""
        plan = lm.plan
        if lm.seq2seq:
            raise ConfigError("train.objective=reward_model trains a decoder-only model; model.name is an "
                              "encoder-decoder: give a causal LM")  # fmt: skip
        if plan.train.strategy != "ddp":
            raise ConfigError(f"train.objective=reward_model with train.strategy={plan.train.strategy!r}: a reward "
                              "model trains under DDP only; set train.strategy=ddp")  # fmt: skip
        if plan.lora.applied_quantize(plan.train.method) != "none":
            raise ConfigError("train.objective=reward_model with lora.quantize: the classifier loads unquantized; "
                              "set lora.quantize=none")  # fmt: skip
        return cls(lm, plan.train.reward_model)

    @property
    def model_type(self) -> str:
        """The base model's type, for the precision checks."""
        return self.lm.model_type

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The classifier (:func:`load_classifier`) made ready to train as the run's causal LM is (attention,
        LoRA adapter restored from ``restore_dir`` when given, activation checkpointing, compiled blocks)."""
        plan = self.lm.plan
        net = load_classifier(self.lm, restore_dir, device_type)
        return prepare_training_model(
            net, plan.lora, plan.train.method, plan.model.attn_implementation, device_type,
            gradient_checkpointing=plan.train.gradient_checkpointing, compile_blocks=plan.train.compile is True,
            restore_dir=restore_dir if plan.train.method == "lora" else None, liger_kernels=plan.train.liger_kernels,
            frozen_bf16=plan.train.frozen_precision == "bf16",
        )  # fmt: skip

    def collate(self, units: list[Unit]) -> PairRows:
        """Pairs as one micro-batch of rows (chosen rows first)."""
        from rayft.training.modeling.attention import row_multiple

        return collate_pairs(
            units, self.lm.tokenizer.pad_token_id, row_multiple(self.lm.plan.model.attn_implementation)
        )

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The sum of the batch's pair losses; the figures' sums are kept for :meth:`figures`."""
        assert isinstance(batch, PairRows)  # the loop trains on what collate() made
        scores = pair_scores(model, batch.rows, precision)
        for name, value in figure_sums(scores).items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        s = self.settings
        return bradley_terry_losses(scores, margin=s.margin, center_coefficient=s.center_rewards_coefficient).sum()

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """Every rank's pair accuracy, mean margin and mean scores since the last call, and reset."""
        return {f"reward_model/{name}": value for name, value in self.take_figures(device, units).items()}

    def take_figures(self, device: torch.device, pairs: float) -> dict[str, float]:
        """Every rank's figure sums since the last call, as means over ``pairs`` (every rank's), and reset."""
        return take_means(self.sums, FIGURES, device, pairs)

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Mean pair loss, pair accuracy and mean margin over every worker's validation pairs."""
        import torch

        inner = unwrap(model)
        was_training, saved = inner.training, dict(self.sums)
        inner.eval()
        self.sums.clear()
        loss, pairs = 0.0, 0
        with torch.no_grad():
            for chunk in micro_batches(iter(units), batch_size):
                batch = self.collate(chunk).to(device)
                loss += float(self.loss_sum(inner, batch, precision))
                pairs += batch.pairs
        inner.train(was_training)
        total_loss, total_pairs = all_reduce_sum([loss, float(pairs)], device)
        figures = self.take_figures(device, total_pairs)
        self.sums.update(saved)
        return {"eval/loss": total_loss / max(total_pairs, 1.0), "eval/pair_accuracy": figures["accuracy"],
                "eval/margin": figures["margin"]}  # fmt: skip

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """The files :class:`CausalLm` writes: the classifier's weights (or the adapter with the score head),
        its tokenizer and the resolved config."""
        self.lm.write_model(model, directory, state_dict)
