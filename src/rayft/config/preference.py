"""Config section of preference training (DPO, ORPO, SimPO): the losses' settings and the prompt's share
of a pair's tokens."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rayft.config.base import Section


class PreferenceConfig(Section):
    """How preference pairs are trained: the loss's temperature and margins, and truncation."""

    beta: float = Field(
        0.1,
        gt=0,
        description=(
            "DPO: strength of the pull toward the reference model (higher keeps the policy closer); SimPO: the "
            "reward scale (the paper uses 2.0-2.5). TRL's beta."
        ),
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="DPO's loss: 'sigmoid' (the paper's) or 'ipo' (squared, on per-token averaged log-ratios).",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="DPO and SimPO: the assumed probability that a pair's labels are swapped (conservative DPO).",
    )
    orpo_lambda: float = Field(
        0.1, gt=0, description="ORPO: weight of the odds-ratio term beside the chosen response's likelihood."
    )
    simpo_gamma: float = Field(0.5, ge=0, description="SimPO: the target reward margin between chosen and rejected.")
    max_prompt_length: int = Field(
        256,
        gt=0,
        description=(
            "When a pair is longer than data.max_seq_length, its prompt is cut from the start (keeping the end) "
            "to leave room for the longer response, but not below this many tokens; then the responses are cut."
        ),
    )
