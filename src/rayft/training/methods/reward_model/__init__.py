"""A Bradley-Terry reward model on preference pairs (``train.objective: reward_model``): the method
(:mod:`.method`) and its loss (:mod:`.losses`)."""

from __future__ import annotations

from rayft.training.loop.method import Method
from rayft.training.loop.objective import CausalLm
from rayft.training.methods.reward_model.method import RewardModelTraining
from rayft.training.methods.unit import MethodUnit


def build(lm: CausalLm) -> Method:
    """The method around the run's causal LM."""
    return RewardModelTraining.build(lm)


UNIT = MethodUnit(build)
