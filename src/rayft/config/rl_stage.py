"""Config section of the ``rl`` stage of ``rayft run``: GRPO after SFT, on the data's prompts."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rayft.config.data import DataConfig
from rayft.config.pairs import merge_nested, refuse_nested_method_section, validated_section
from rayft.config.rl import RlConfig
from rayft.config.train import TrainConfig


class RlStageConfig(RlConfig):
    """Reinforcement learning in ``rayft run`` after the train stage (or from ``model.name`` without one): it
    starts from the SFT model (a LoRA adapter merged into its base first, then a fresh adapter) and trains
    with ``train.objective: grpo`` on the prompts of the data section's datasets, their responses the
    references the rewards compare with. The eval stage then compares the SFT model with the RL model.
    The RL settings (``group_size``, ``rewards``, ...) sit directly in this section and are the training's
    ``train.rl``; ``train`` and ``data`` name what else differs from the pipeline's sections."""

    train: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "What differs from the train section in the RL training, other than its RL settings (this section's "
            "own), as a nested mapping merged into it, e.g. {learning_rate: 5.0e-5, max_steps: 30}."
        ),
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "What differs from the data section (e.g. {datasets: [...]} for other prompts, {max_rows: ...}); "
            "packing is off."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nested_rl(cls, raw: Any) -> Any:
        refuse_nested_method_section(raw, "rl")
        return raw


def rl_train_section(train: TrainConfig, stage: RlStageConfig) -> TrainConfig:
    """The train section of the RL training: ``train`` with the stage's changes, ``objective: grpo``, and the
    stage's RL settings as ``train.rl``.

    Raises:
        ValueError: a change names an unknown field or a bad value (its dotted path under rl.train).
    """
    method = stage.model_dump(mode="json", include=set(RlConfig.model_fields))
    raw = merge_nested(train.model_dump(mode="json"), {**stage.train, "objective": "grpo", "rl": method})
    section: TrainConfig = validated_section(TrainConfig, raw, "rl.train")
    return section


def rl_data_section(data: DataConfig, stage: RlStageConfig) -> DataConfig:
    """The data section of the RL training: ``data`` with the stage's changes, packing off."""
    raw = merge_nested(data.model_dump(mode="json"), stage.data)
    raw["packing"] = False
    section: DataConfig = validated_section(DataConfig, raw, "rl.data")
    return section
