"""The one place ``train.objective`` is resolved: each name's :class:`~rayft.training.methods.unit.MethodUnit`,
and the :class:`~rayft.training.loop.method.MethodCatalog` the driver hands the loop. Adding a method adds
its folder and one line here (and its name to :mod:`rayft.config.objectives`)."""

from __future__ import annotations

from rayft.custom import load_task
from rayft.models.architecture import model_type, resolve_architecture
from rayft.models.loading import load_tokenizer
from rayft.training.loop.checkpointing import ModelFiles
from rayft.training.loop.method import Method, MethodTraits
from rayft.training.loop.objective import CausalLm
from rayft.training.loop.worker_plan import WorkerPlan
from rayft.training.methods import preference, reward_model, rl, sft, sft_kl
from rayft.training.methods.task.method import TaskObjective
from rayft.training.methods.unit import MethodUnit

METHODS: dict[str, MethodUnit] = {
    "sft": sft.UNIT,
    "dpo": preference.unit("dpo"),
    "orpo": preference.unit("orpo"),
    "simpo": preference.unit("simpo"),
    "grpo": rl.UNIT,
    "sft_kl": sft_kl.UNIT,
    "reward_model": reward_model.UNIT,
}


def method_unit(objective: str) -> MethodUnit:
    """The unit of ``objective`` (a name the config's ``train.objective`` accepts)."""
    return METHODS[objective]


class RegisteredMethods:
    """The :class:`~rayft.training.loop.method.MethodCatalog` of the registered methods: a plan's custom
    task, or the unit its ``train.objective`` names around the plan's causal LM."""

    def traits(self, plan: WorkerPlan) -> MethodTraits:
        """A custom task's steps are planned as SFT's (their settings are kept); else the unit's traits."""
        if plan.task is not None:
            return MethodTraits(token_loss=True)
        return method_unit(plan.train.objective).traits(plan.train)

    def build(self, plan: WorkerPlan, files: ModelFiles) -> Method:
        """The plan's custom task (with its datasets), or its objective's method."""
        if plan.task is not None:
            task = load_task(plan.task.path or "", plan.task.options)
            return TaskObjective(task, task.build_datasets(plan.seed), plan.resolved_config)
        seq2seq = resolve_architecture(plan.model) == "seq2seq"
        lm = CausalLm(plan, load_tokenizer(plan.model), files, model_type(plan.model), seq2seq)
        return method_unit(plan.train.objective).build(lm)


REGISTERED = RegisteredMethods()
