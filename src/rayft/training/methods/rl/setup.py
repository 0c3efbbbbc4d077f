"""What a training worker sets up for GRPO beyond what every method needs: where its rollouts are sampled
(on itself, or on generation actors built from its model), with those it had sampled ahead at the
checkpoint it resumes from."""

from __future__ import annotations

from pathlib import Path

from rayft.runs import layout
from rayft.training.loop.session import TrainSession
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.methods.rl.rollout_actors import ActorSpec, Rollouts, build_rollouts
from rayft.training.methods.rl.sampling import Sampler


def read_rollouts_ahead(restore_dir: Path | None, rank: int) -> str | None:
    """The rollouts this rank had sampled ahead (asynchronous GRPO) at the checkpoint it resumes from."""
    saved = restore_dir / layout.TRAINER_SUBDIR / layout.rollouts_file(rank) if restore_dir else None
    return saved.read_text() if saved is not None and saved.is_file() else None


def actor_spec(plan: WorkerPlan) -> ActorSpec:
    """What this worker's generation actors are built from: its model as the step's planner decided it (the
    frozen layers' precision included, so that an actor samples what the trainer's model would)."""
    rl = plan.train.rl
    return ActorSpec(plan.model, plan.lora, plan.train.method, rl, rl.rollout.num_gpus_per_actor,
                     frozen_bf16=plan.train.frozen_precision == "bf16")  # fmt: skip


def build_worker_rollouts(plan: WorkerPlan, session: TrainSession, sampler: Sampler, ahead: str | None
                          ) -> Rollouts:  # fmt: skip
    """Where this worker's rollouts are sampled (its generation actors started, with actors), with the
    rollouts it had sampled ahead at the checkpoint it resumes from."""
    rollout = plan.train.rl.rollout
    rollouts = build_rollouts(actor_spec(plan), rollout, sampler, plan.seed, world_size=session.world_size,
                              rank=session.rank)  # fmt: skip
    if ahead is not None:
        rollouts.restore(ahead)
    return rollouts
