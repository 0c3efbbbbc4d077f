"""What the config knows of each training method (``train.objective``) before any training code loads: the
kind of data it reads and whether its workers sample. Validators and the driver ask these traits instead of
testing objective names; the training code of each method lives in ``rayft.training.methods`` (its registry
maps the same names to their units, and a unit test keeps the two tables in step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ObjectiveName = Literal["sft", "dpo", "orpo", "simpo", "grpo", "sft_kl", "reward_model"]
DataKind = Literal["examples", "pairs", "prompts"]


@dataclass(frozen=True)
class ObjectiveTraits:
    """The facts about a training method that the config and the driver need."""

    data: DataKind  # supervised examples, preference pairs (prompt/chosen/rejected), or prompts to sample from
    samples: bool = False  # its workers sample completions during training (from the whole weights)
    token_loss: bool = False  # its loss is the next-token loss alone, which the step planner may fuse or unpad
    unpacked_because: str = ""  # why its rows cannot be packed (data.packing), as the refusal says it
    padding_free: bool = False  # train.padding_free lays its micro-batches' sequences end to end for the forward

    @property
    def packed_instead(self) -> str:
        """What the data.packing refusal offers instead, where the objective has padding-free steps."""
        return " (train.padding_free=true lays each micro-batch's sequences end to end)" if self.padding_free else ""


_PAIRS = (
    "a preference pair's chosen and rejected responses are compared as two sequences of one prompt, and packing "
    "would join unrelated pairs in one row"
)
_ROWS = "its KL term compares each row's token distributions with the base model's, row by row"
_PROMPTS = "each row's prompt is sampled from on its own, and packing would join unrelated rows"

OBJECTIVES: dict[str, ObjectiveTraits] = {
    "sft": ObjectiveTraits("examples", token_loss=True),
    "dpo": ObjectiveTraits("pairs", unpacked_because=_PAIRS, padding_free=True),
    "orpo": ObjectiveTraits("pairs", unpacked_because=_PAIRS, padding_free=True),
    "simpo": ObjectiveTraits("pairs", unpacked_because=_PAIRS, padding_free=True),
    "grpo": ObjectiveTraits("prompts", samples=True, unpacked_because=_PROMPTS, padding_free=True),
    "sft_kl": ObjectiveTraits("examples", unpacked_because=_ROWS),
    "reward_model": ObjectiveTraits("pairs", unpacked_because=_PAIRS),
}


def objective_traits(objective: str) -> ObjectiveTraits:
    """The traits of ``objective`` (a name the config's ``train.objective`` accepts)."""
    return OBJECTIVES[objective]
