"""Config of reward models: training one on preference pairs (``train.objective: reward_model``, the
``train.reward_model`` section) and reading one as a reinforcement-learning reward
(``train.rl.rewards[].reward_model``, with ``function: reward_model``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from rayft.config.base import Section


class RewardModelTrainConfig(Section):
    """How a Bradley-Terry reward model is trained on prompt/chosen/rejected pairs."""

    margin: float = Field(
        0.0,
        ge=0,
        description=(
            "The gap the chosen response's score should clear over the rejected one's: each pair's loss is "
            "-log sigmoid(r_chosen - r_rejected - margin) (TRL RewardTrainer's margin, the same for every pair). "
            "0: the plain Bradley-Terry loss."
        ),
    )
    center_rewards_coefficient: float | None = Field(
        None,
        gt=0,
        description=(
            "Adds this coefficient times the mean of (r_chosen + r_rejected)^2 to each pair's loss, which keeps "
            "the scores centred on 0 (TRL's center_rewards_coefficient; the InstructGPT paper's 0.01). Unset: none."
        ),
    )


class RewardModelConfig(Section):
    """A sequence classifier with one output read as a reward: the score of the prompt and the completion,
    rendered with the classifier's chat template, computed on the training worker in process."""

    path: str = Field(
        ...,
        description=(
            "The reward model: the final/ (or a checkpoints/step-N/) directory of a train.objective=reward_model "
            "run (a full model, or a LoRA adapter with its score head, on the base it names), any local directory "
            "that transformers' AutoModelForSequenceClassification loads with one label, or a Hub id."
        ),
    )
    prompt_column: str = Field(
        "prompt",
        description=(
            "The data column holding each row's prompt, carried to the reward model: the prompt is the user turn "
            "and the completion the assistant turn of the conversation it scores ('question' for GSM8K)."
        ),
    )
    normalize: Literal["none", "sigmoid", "batch"] = Field(
        "none",
        description=(
            "How the raw score becomes the reward: 'none' (the score as it is), 'sigmoid' (mapped onto (0, 1): the "
            "Bradley-Terry probability of beating a response scored 0), 'batch' (standardised over the completions "
            "scored together: minus their mean, over their standard deviation)."
        ),
    )
    batch_size: int = Field(16, gt=0, description="Completions scored in one forward pass of the reward model.")
    max_length: int = Field(
        1024,
        gt=0,
        description="Longest conversation scored, in tokens; a longer one keeps its end (where the score is read).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="The dtype the reward model computes in on the worker's CPU."
    )

    @field_validator("path")
    @classmethod
    def _anchored(cls, value: str) -> str:
        # Ray's workers run in a directory of their own: a relative local path is made absolute where the config
        # loads. A Hub id ('org/name') that is not a directory here stays as it is.
        path = Path(value).expanduser()
        if not path.is_absolute() and (path.exists() or value.startswith((".", "~"))):
            return str(path.resolve())
        return value
