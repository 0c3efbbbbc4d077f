"""Online reinforcement learning against verifiers (``train.objective: grpo``): the method (:mod:`.method`),
its micro-batches (:mod:`.batches`), figures (:mod:`.figures`) and held-out scoring (:mod:`.evaluation`), its
losses and advantage estimators (:mod:`.losses`), and its rollouts: sampling (:mod:`.sampling`), on the
workers or on generation actors (:mod:`.rollout_actors`, :mod:`.rollout_plan`, :mod:`.setup`)."""

from __future__ import annotations

from rayft.config.train import TrainConfig
from rayft.training.loop.method import Method, MethodTraits
from rayft.training.loop.objective import CausalLm
from rayft.training.methods.rl.method import RlTraining
from rayft.training.methods.unit import MethodUnit


def build(lm: CausalLm) -> Method:
    """GRPO (and its variants) around the run's causal LM, its reward functions loaded."""
    return RlTraining.build(lm, lm.plan.train.rl, lm.plan.seed)


def traits(train: TrainConfig) -> MethodTraits:
    """A frozen reference copy when the KL term asks for one; a run may end with the weights it started
    from (groups whose rewards never differ train nothing)."""
    return MethodTraits(reference_copy=train.rl.reference_kind(train.method) == "copy", untrained_allowed=True)


UNIT = MethodUnit(build, traits)
