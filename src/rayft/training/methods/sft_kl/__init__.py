"""SFT with a KL penalty to the base model (``train.objective: sft_kl``): the method (:mod:`.method`) and
its loss (:mod:`.losses`)."""

from __future__ import annotations

from rayft.config.train import TrainConfig
from rayft.training.loop.method import Method, MethodTraits
from rayft.training.loop.objective import CausalLm
from rayft.training.methods.sft_kl.method import KlSftTraining
from rayft.training.methods.unit import MethodUnit


def build(lm: CausalLm) -> Method:
    """The method around the run's causal LM."""
    return KlSftTraining.build(lm)


def traits(train: TrainConfig) -> MethodTraits:
    """Full fine-tuning scores against a frozen fp32 copy of the base."""
    return MethodTraits(reference_copy=train.method == "full")


UNIT = MethodUnit(build, traits)
