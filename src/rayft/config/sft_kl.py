"""Config section of supervised fine-tuning with a KL penalty to the base model (``train.objective: sft_kl``)."""

from __future__ import annotations

from pydantic import Field

from rayft.config.base import Section


class SftKlConfig(Section):
    """How strongly KL-regularised SFT holds the policy to the base model."""

    beta: float = Field(
        0.1,
        gt=0,
        description=(
            "Weight of the KL term: each label token's loss is its cross-entropy plus beta times KL(policy || base) "
            "over the whole vocabulary at that position (higher keeps the model closer to the base). The base is "
            "the model with its LoRA adapter off, or, for train.method=full, a frozen copy of it."
        ),
    )
