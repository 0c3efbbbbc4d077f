"""Supervised fine-tuning (``train.objective: sft``): the causal LM's own next-token loss
(:class:`rayft.training.loop.objective.CausalLm`), which every language-model method builds on."""

from __future__ import annotations

from rayft.config.train import TrainConfig
from rayft.training.loop.method import Method, MethodTraits
from rayft.training.loop.objective import CausalLm
from rayft.training.methods.unit import MethodUnit


def build(lm: CausalLm) -> Method:
    """The causal LM itself: its loss is the next-token loss."""
    return lm


def traits(train: TrainConfig) -> MethodTraits:
    """A next-token loss, which the step planner may fuse or unpad."""
    return MethodTraits(token_loss=True)


UNIT = MethodUnit(build, traits)
