"""The micro-batches of a GRPO step: prepared rows read as prompts (with the references and row columns the
rewards read), and sampled completions laid out as rows to train on (:class:`RolloutBatch`).

The method (:mod:`rayft.training.methods.rl.method`) samples, scores and runs the forwards; what is here only
reshapes token lists, so it is checked without a model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rayft.data.collate import MicroBatch
from rayft.data.prepared import IGNORE_INDEX
from rayft.errors import DataError
from rayft.training.loop.batches import OnRows, Unit
from rayft.training.methods.rl.sampling import Completions, PromptBatch

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass
class RolloutBatch(OnRows):
    """A micro-batch of sampled completions, ready to train on: each row a prompt and one completion
    (labels on the completion), with its advantage and, for the KL penalty, its reference log-probabilities."""

    rows: MicroBatch
    advantages: torch.Tensor
    ref_logps: torch.Tensor | None
    terms: int
    old_logps: torch.Tensor | None = None  # the rollout policy's, when the rollout is trained on more than once
    # The sampling weights' log-probabilities of a stale rollout, (rows, target positions) of ``rows``.
    behaviour_logps: torch.Tensor | None = None
    weight: float = 1.0  # 0: a batch that only keeps the workers in lockstep (dynamic sampling found nothing)
    teacher_logps: torch.Tensor | None = None  # on-policy distillation's teacher, the policy's layout

    @property
    def num_label_tokens(self) -> int:
        """Loss terms (completions, or completion tokens with the 'dapo' loss)."""
        return self.terms

    def to(self, device: torch.device) -> RolloutBatch:
        """The same batch with its tensors on ``device``."""
        ref = None if self.ref_logps is None else self.ref_logps.to(device)
        old = None if self.old_logps is None else self.old_logps.to(device)
        behaviour = None if self.behaviour_logps is None else self.behaviour_logps.to(device)
        teacher = None if self.teacher_logps is None else self.teacher_logps.to(device)
        return RolloutBatch(self.rows.to(device), self.advantages.to(device), ref, self.terms, old, behaviour,
                            self.weight, teacher)  # fmt: skip


# -- prompts in -------------------------------------------------------------------------------------------


def split_unit(unit: Unit) -> tuple[list[int], list[int]]:
    """A prepared row's prompt (the tokens before its first label) and its response tokens (the labelled)."""
    ids, labels = list(unit["input_ids"]), list(unit["labels"])
    first = next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(ids))
    return ids[:first], [t for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]


def carried_row(unit: Unit) -> dict[str, Any]:
    """The columns a prepared prompt carries to the rewards (its ``row`` column, see
    :mod:`rayft.data.prepared`); DataError when the prepared data has none."""
    text = unit.get("row")
    if not text:
        raise DataError(
            "train.rl: the rewards read each row's columns, but the prepared data carries none; prepare the data "
            "with this config (rayft data prepare <config>, or let rayft train prepare it)"
        )
    return cast("dict[str, Any]", json.loads(text))


def prompt_batch(units: Sequence[Unit], tokenizer: PreTrainedTokenizerBase, *, carried: bool) -> PromptBatch:
    """The units' prompts, references (decoded response text) and, when ``carried``, the columns carried
    with them (:func:`carried_row`)."""
    prompts, references = [], []
    for unit in units:
        prompt, response = split_unit(unit)
        prompts.append(prompt)
        references.append(cast("str", tokenizer.decode(response, skip_special_tokens=True)))  # one text
    rows = [carried_row(unit) for unit in units] if carried else []
    return PromptBatch(prompts, references, [int(i) for u in units for i in u["sample_ids"]], rows)


# -- completions out --------------------------------------------------------------------------------------


def masked(completion: Sequence[int], mask: Sequence[int]) -> list[int]:
    """A completion's labels: its tokens where ``mask`` is 1 (sampled), IGNORE_INDEX where 0 (an environment's)."""
    return [token if keep else IGNORE_INDEX for token, keep in zip(completion, mask, strict=True)]


def trained_counts(sampled: Completions) -> list[int]:
    """Each completion's trained tokens: all of them, or an episode's sampled ones (its environment's answers
    are context)."""
    return [len(ids) for ids in sampled.token_ids] if sampled.masks is None else [sum(m) for m in sampled.masks]


def completion_units(
    batch: PromptBatch, sampled: Completions, cut: Sequence[bool], *, group: int, mask_truncated: bool
) -> list[Unit]:
    """Each completion (``group`` consecutive ones per prompt of ``batch``) as a row after its prompt, labelled
    on its sampled tokens; with ``mask_truncated``, a completion ``cut`` short has no label. A group's first
    row carries its prompt's sample id."""
    units = []
    for index, completion in enumerate(sampled.token_ids):
        prompt = batch.prompts[index // group]
        ids = prompt + completion
        # Only sampled tokens are trained: an episode's environment answers (mask 0) are context.
        trained = completion if sampled.masks is None else masked(completion, sampled.masks[index])
        dropped = mask_truncated and cut[index]
        labels = [IGNORE_INDEX] * len(ids) if dropped else [IGNORE_INDEX] * len(prompt) + trained
        units.append({"input_ids": ids, "labels": labels, "position_ids": range(len(ids)),
                      "sample_ids": [batch.sample_ids[index // group]] if index % group == 0 else []})  # fmt: skip
    return units


def behaviour_rows(units: Sequence[Unit], behaviour: Sequence[Sequence[float]], rows: MicroBatch) -> torch.Tensor:
    """Each unit's ``behaviour`` log-probabilities (one per trained token: a completion's sampled tokens) laid
    out as the rows' target positions (``labels[:, 1:]``, 0 elsewhere)."""
    import torch

    out = torch.zeros(rows.labels.shape[0], rows.labels.shape[1] - 1, dtype=torch.float32)
    for index, (unit, values) in enumerate(zip(units, behaviour, strict=True)):
        # Target t predicts token t + 1: the trained token at position p is target p - 1.
        targets = [i - 1 for i, label in enumerate(unit["labels"]) if label != IGNORE_INDEX]
        if values and targets:  # not: nothing sampled, or a truncated completion masked out of the loss
            out[index, targets] = torch.tensor(values, dtype=torch.float32)
    return out
