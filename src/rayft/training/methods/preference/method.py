"""Preference training (DPO, ORPO, SimPO) through the loop's objective seam.

A training unit is one pair: the chosen and the rejected row (see :mod:`rayft.data.preference`),
run through the model as one micro-batch of two rows per pair, or, with ``train.padding_free``, every
row of the micro-batch laid end to end in one (positions restarting per sequence, so attention stays
within each; each sequence's log-probability is gathered back from it). A pair is one loss term, so the
loop's normalisation (the sum of every worker's loss terms over their count) makes each update the
mean loss over the step's pairs whatever the split into workers and micro-batches.

DPO's reference log-probabilities come from the batch when preparation stored them (full fine-tuning:
a pass over the pairs with the base model, so no second model is held during training), or, for
LoRA, from the same model with its adapter disabled. ORPO and SimPO need none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from rayft.data.collate import MicroBatch, collate
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import ConfigError
from rayft.training.loop.batches import OnRows, TrainBatch, Unit, micro_batches
from rayft.training.loop.method import MethodHooks
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.session import all_reduce_sum, take_means
from rayft.training.loop.steps import in_lockstep
from rayft.training.loop.targets import target_scores
from rayft.training.methods.preference.losses import (
    PairLogps,
    PairLosses,
    dpo_losses,
    orpo_losses,
    pair_figure_tensors,
    simpo_losses,
    token_logps,
)
from rayft.training.methods.preference.losses import (
    PreferenceObjective as ObjectiveName,
)
from rayft.training.methods.unit import Registry
from rayft.training.modeling.model import check_adapter_off_is_base, unwrap

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

    from rayft.config.preference import PreferenceConfig
    from rayft.training.modeling.precision import Precision

FIGURES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")  # fmt: skip


class PairLossFn(Protocol):
    """An objective's per-pair losses of a micro-batch, from the policy's log-probabilities (``training``:
    the method, for its settings and DPO's reference)."""

    def __call__(
        self, training: PreferenceTraining, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps,
        precision: Precision,
    ) -> PairLosses: ...  # fmt: skip


@dataclass(frozen=True)
class PairObjective:
    """A registered preference objective: its losses, and whether TRL logs its figures from length-averaged
    log-probabilities (ORPO's and SimPO's trainers do, DPO's does not)."""

    losses: PairLossFn
    averaged: bool


PAIR_OBJECTIVES: Registry[PairObjective] = Registry("train.objective")


@dataclass
class PreferenceBatch(OnRows):
    """A micro-batch of pairs: ``rows`` holds every chosen row, then every rejected row."""

    rows: MicroBatch
    pairs: int
    reference: tuple[torch.Tensor, torch.Tensor] | None = None  # stored (chosen, rejected) reference log-probs

    @property
    def num_label_tokens(self) -> int:
        """Loss terms: the pairs."""
        return self.pairs

    def to(self, device: torch.device) -> PreferenceBatch:
        """The same batch with its tensors on ``device``."""
        reference = None if self.reference is None else (self.reference[0].to(device), self.reference[1].to(device))
        return PreferenceBatch(self.rows.to(device), self.pairs, reference)


def collate_preference(
    units: Sequence[Unit], pad_token_id: int, pad_to_multiple_of: int = 1, *, packed: bool = False
) -> PreferenceBatch:
    """Pair units (``chosen_input_ids``, ``chosen_labels``, ``rejected_*``, ``sample_ids``, and
    ``ref_chosen_logps`` / ``ref_rejected_logps`` when stored) as one padded micro-batch of rows; with
    ``packed``, the rows also laid end to end in one row, which the forward passes run on."""
    import torch

    sides = []
    for side in ("chosen", "rejected"):
        for unit in units:
            ids = list(unit[f"{side}_input_ids"])
            sides.append({"input_ids": ids, "labels": list(unit[f"{side}_labels"]), "position_ids": range(len(ids)),
                          "sample_ids": unit["sample_ids"] if side == "chosen" else []})  # fmt: skip
    rows = collate(sides, pad_token_id, pad_to_multiple_of, packed=packed)
    reference = None
    if units and units[0].get("ref_chosen_logps") is not None:
        reference = tuple(torch.tensor([float(u[f"ref_{side}_logps"]) for u in units], dtype=torch.float32)
                          for side in ("chosen", "rejected"))  # fmt: skip
    return PreferenceBatch(rows, len(units), reference)  # type: ignore[arg-type]


def pair_logps(model: torch.nn.Module, rows: MicroBatch, precision: Precision) -> PairLogps:
    """The log-probabilities of each row's response under ``model``, as chosen and rejected halves.

    Logits are computed only at the positions some row trains on (``logits_to_keep``, as the SFT
    loss does), which skips the vocabulary projection over the prompts; rows that carry their packed
    form run the forward on it (:func:`rayft.training.loop.targets.target_scores`)."""
    (logps,), targets = target_scores(model, rows, precision.autocast_dtype, token_logps)
    sums, counts = logps.sum(-1), (targets != IGNORE_INDEX).sum(-1)
    half = sums.shape[0] // 2
    return PairLogps(sums[:half], sums[half:], counts[:half], counts[half:])


@dataclass(frozen=True)
class PreferenceTraining(MethodHooks):
    """The :class:`~rayft.training.loop.method.Method` of DPO, ORPO and SimPO: the model, its
    files and checkpoints are those of :class:`~rayft.training.loop.objective.CausalLm` (LoRA or full);
    only the batches and the loss differ."""

    lm: CausalLm
    objective: ObjectiveName
    settings: PreferenceConfig
    figure_sums: dict[str, Any] = field(default_factory=dict)  # 0-d tensors since the last take_figures(), this rank's
    throughput_unit: str = "tokens"

    @property
    def model_type(self) -> str:
        """The base model's type, for the precision checks."""
        return self.lm.model_type

    def build_model(self, restore_dir: Path | None, *, device_type: str, weights: bool) -> torch.nn.Module:
        """The model :class:`CausalLm` builds."""
        return self.lm.build_model(restore_dir, device_type=device_type, weights=weights)

    def write_model(self, model: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
        """The files :class:`CausalLm` writes."""
        self.lm.write_model(model, directory, state_dict)

    def collate(self, units: list[Unit]) -> PreferenceBatch:
        """Pairs as one micro-batch of rows (chosen rows first), laid end to end with ``train.padding_free``."""
        from rayft.training.modeling.attention import row_multiple

        plan = self.lm.plan
        return collate_preference(units, self.lm.tokenizer.pad_token_id, row_multiple(plan.model.attn_implementation),
                                  packed=plan.train.padding_free is True)  # fmt: skip

    def loss_sum(self, model: torch.nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
        """The sum of the batch's per-pair losses; the figures TRL logs are added to :attr:`figure_sums`."""
        assert isinstance(batch, PreferenceBatch)  # the loop trains on what collate() made
        policy = pair_logps(model, batch.rows, precision)
        result = self.losses(model, batch, policy, precision)
        averaged = PAIR_OBJECTIVES[self.objective].averaged
        for name, value in pair_figure_tensors(policy, result, averaged=averaged).items():
            self.figure_sums[name] = self.figure_sums.get(name, 0.0) + value
        return result.losses.sum()

    def losses(
        self, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps, precision: Precision
    ) -> PairLosses:
        """Each pair's loss under the configured objective (:data:`PAIR_OBJECTIVES`)."""
        return PAIR_OBJECTIVES[self.objective].losses(self, model, batch, policy, precision)

    def reference(
        self, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps, precision: Precision
    ) -> PairLogps:
        """DPO's reference log-probabilities: stored with the pairs, or the model with its LoRA adapter off."""
        import torch

        if batch.reference is not None:
            chosen, rejected = batch.reference
            return PairLogps(chosen, rejected, policy.chosen_tokens, policy.rejected_tokens)
        inner = unwrap(model)
        if not hasattr(inner, "disable_adapter"):
            raise ConfigError(
                "DPO with train.method 'full' needs the reference log-probabilities stored with the prepared pairs; "
                "prepare the pairs for this run (rayft data prepare) or train a LoRA adapter (train.method: lora)"
            )
        check_adapter_off_is_base(inner, "DPO's reference (no reference log-probabilities are stored with the pairs)")
        with torch.no_grad(), cast("PeftModel", inner).disable_adapter():
            return pair_logps(model, batch.rows, precision)

    def figures(self, device: torch.device, *, world_size: int, units: float) -> dict[str, float]:
        """TRL's figures, under TRL's names, over every rank's ``units`` (pairs) since the last call."""
        return self.take_figures(device, units)

    def take_figures(self, device: torch.device, pairs: float) -> dict[str, float]:
        """Every rank's figure sums since the last call, as means over ``pairs`` (every rank's), and reset."""
        return take_means(self.figure_sums, FIGURES, device, pairs)

    def evaluate(
        self, model: torch.nn.Module, units: Iterable[Unit], *, batch_size: int, precision: Precision,
        device: torch.device, lockstep: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Mean pair loss and the TRL figures over every worker's validation pairs."""
        import torch

        inner = unwrap(model)
        was_training = inner.training
        inner.eval()
        batches = [self.collate(chunk) for chunk in micro_batches(iter(units), batch_size)]
        if lockstep:  # a sharded model: every rank runs as many forwards as the one with the most batches
            idle = in_lockstep([b.rows for b in batches])[len(batches) :]
            batches += [PreferenceBatch(rows, 0) for rows in idle]
        loss, pairs, saved = 0.0, 0, dict(self.figure_sums)
        self.figure_sums.clear()
        with torch.no_grad():
            for batch in batches:
                if batch.pairs == 0:
                    inner(input_ids=batch.rows.input_ids.to(device), use_cache=False)
                    continue
                loss += float(self.loss_sum(inner, batch.to(device), precision))
                pairs += batch.pairs
        inner.train(was_training)
        total_loss, total_pairs = all_reduce_sum([loss, float(pairs)], device)
        figures = self.take_figures(device, total_pairs)
        self.figure_sums.update(saved)
        return {"eval/loss": total_loss / max(total_pairs, 1.0), **{f"eval/{k}": v for k, v in figures.items()}}


def dpo(
    training: PreferenceTraining, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps,
    precision: Precision,
) -> PairLosses:  # fmt: skip
    """DPO's losses, against the reference log-probabilities (stored, or the base with the adapter off)."""
    s = training.settings
    reference = training.reference(model, batch, policy, precision)
    return dpo_losses(policy, reference, beta=s.beta, label_smoothing=s.label_smoothing, loss=s.loss)


def orpo(
    training: PreferenceTraining, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps,
    precision: Precision,
) -> PairLosses:  # fmt: skip
    """ORPO's losses: likelihood plus the odds-ratio term (no reference)."""
    return orpo_losses(policy, lam=training.settings.orpo_lambda)


def simpo(
    training: PreferenceTraining, model: torch.nn.Module, batch: PreferenceBatch, policy: PairLogps,
    precision: Precision,
) -> PairLosses:  # fmt: skip
    """SimPO's losses: length-normalised rewards with a margin (no reference)."""
    s = training.settings
    return simpo_losses(policy, beta=s.beta, gamma=s.simpo_gamma, label_smoothing=s.label_smoothing)


PAIR_OBJECTIVES.register("dpo")(PairObjective(dpo, averaged=False))
PAIR_OBJECTIVES.register("orpo")(PairObjective(orpo, averaged=True))
PAIR_OBJECTIVES.register("simpo")(PairObjective(simpo, averaged=True))
