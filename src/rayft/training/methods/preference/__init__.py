"""Preference training on prompt/chosen/rejected pairs (``train.objective`` dpo, orpo, simpo): the pair
batches and the objective's loss (:mod:`.method`), the losses themselves (:mod:`.losses`), and DPO's
reference log-probabilities, computed once before full fine-tuning (:mod:`.reference`)."""

from __future__ import annotations

from functools import partial

from rayft.config.model import ModelConfig
from rayft.config.schema import RayftConfig
from rayft.data.prepared import PreparedData
from rayft.training.loop.method import Method
from rayft.training.loop.objective import CausalLm
from rayft.training.methods.preference.losses import PreferenceObjective
from rayft.training.methods.preference.method import PreferenceTraining
from rayft.training.methods.preference.reference import (
    ReferenceJob,
    attach_reference,
    needs_reference,
    reference_device,
)
from rayft.training.methods.unit import DataPass, MethodUnit


def build(objective: PreferenceObjective, lm: CausalLm) -> Method:
    """The preference method of ``objective`` around the run's causal LM."""
    return PreferenceTraining(lm, objective, lm.plan.train.preference)


def data_pass(cfg: RayftConfig, model: ModelConfig) -> DataPass | None:
    """DPO with full fine-tuning: the base model's log-probabilities of every prepared pair, stored with it
    (``model``: the model section with its source anchored)."""
    if not needs_reference(cfg.train.objective, cfg.train.method):
        return None
    return partial(reference_pass, cfg, model)


def reference_pass(cfg: RayftConfig, model: ModelConfig, prepared: PreparedData, use_ray: bool) -> PreparedData:
    """``prepared`` with the reference log-probabilities of its pairs (:func:`.reference.attach_reference`)."""
    device = reference_device(cfg.scaling.use_gpu, use_ray=use_ray)
    job = ReferenceJob(model, cfg.lora, cfg.train.mixed_precision, device)
    return attach_reference(prepared, job, use_ray=use_ray)


def unit(objective: PreferenceObjective) -> MethodUnit:
    """The registry's unit of the preference objective ``objective``."""
    return MethodUnit(partial(build, objective), data_pass=data_pass)
