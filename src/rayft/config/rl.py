"""Config section of online reinforcement learning against verifiers (``train.objective: grpo``): the
group of samples per prompt, how they are generated, the rewards that score them, and the loss."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rayft.config.base import Section

BUILTIN_REWARDS = ("math", "exact_match", "regex", "length")
"""Reward functions rayft ships (``train.rl.rewards[].function``); anything else is ``package.module:function``."""


class RewardConfig(Section):
    """One reward function and its weight in a sample's total reward."""

    function: str = Field(
        ...,
        description=(
            "'math' (1 when the number the completion ends on, read with the GSM8K extraction, equals the "
            "reference's final number), 'exact_match' (1 when the normalised completion equals the reference), "
            "'regex' (1 when the completion matches `pattern`: a format reward), 'length' (1 minus the "
            "completion's share of rl.max_new_tokens: a brevity reward), or 'package.module:function', called as "
            "fn(completion: str, reference: str) -> float. The reference is the row's response (the answer the "
            "data holds for the prompt)."
        ),
    )
    weight: float = Field(1.0, description="Factor of this function's reward in the sample's total reward.")
    pattern: str | None = Field(
        None,
        description="For function 'regex': the regular expression (Python re.search, DOTALL) a completion must match.",
    )
    name: str | None = Field(
        None, description="The name its figures are logged under (rl/reward/<name>); default: the function."
    )

    @model_validator(mode="after")
    def _pattern_for_regex(self) -> RewardConfig:
        if self.function == "regex" and not self.pattern:
            raise ValueError("reward function 'regex' needs a pattern; set pattern: '<regular expression>'")
        if self.function != "regex" and self.pattern is not None:
            raise ValueError(f"pattern is set for reward function {self.function!r}; pattern is only read by 'regex'")
        if self.function not in BUILTIN_REWARDS and ":" not in self.function:
            raise ValueError(
                f"reward function {self.function!r} is neither built in ({', '.join(BUILTIN_REWARDS)}) nor "
                "'package.module:function'; name one of those"
            )
        return self

    @property
    def label(self) -> str:
        """The name under which its reward is logged."""
        return self.name or self.function.rsplit(":", 1)[-1]


class RlConfig(Section):
    """Group-relative policy optimisation (GRPO and its variants) with on-policy samples scored by rewards.

    Each optimizer step takes its prompts from the training data (the rows' prompts; their responses are
    the references the rewards compare with), samples ``group_size`` completions per prompt with the
    current policy on every worker (colocated with training, so no weights travel), scores them, and
    trains on every completion with its advantage over the prompt's group."""

    group_size: int = Field(
        8,
        ge=2,
        description=(
            "Completions sampled per prompt (GRPO's G). Each prompt's completions are compared with each other, so "
            "a prompt whose completions all score the same teaches nothing; more samples make a difference likelier."
        ),
    )
    max_new_tokens: int = Field(128, gt=0, description="Longest completion sampled, in tokens.")
    completions_per_forward: int | None = Field(
        None,
        gt=0,
        description=(
            "Completions per training forward pass: a step's rollout (train.micro_batch_size prompts x group_size "
            "per worker) is trained in micro-batches of this many rows, which bounds activation memory; the "
            "update is the same whatever the split. Unset: group_size."
        ),
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts (1: off).")
    loss: Literal["grpo", "dr_grpo", "dapo"] = Field(
        "dapo",
        description=(
            "How per-token losses become the step's loss: 'grpo' (each completion's mean token loss, averaged over "
            "completions: DeepSeekMath's), 'dr_grpo' (the token sum over completions times max_new_tokens: Dr. "
            "GRPO's, free of the length bias), 'dapo' (the mean over every completion token of the step: DAPO's "
            "token-level loss). The losses equal TRL's loss types of the same names."
        ),
    )
    advantage: Literal["group", "rloo"] = Field(
        "group",
        description=(
            "The baseline a completion's reward is compared with: 'group' (the mean reward of its prompt's "
            "group, GRPO) or 'rloo' (the mean of the other completions of its prompt, RLOO's leave-one-out)."
        ),
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description=(
            "Divide advantages by the standard deviation of the group's rewards ('group', GRPO), of the worker's "
            "whole rollout batch ('batch'), or not at all ('none', Dr. GRPO and RLOO)."
        ),
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip range of the probability ratio (1 - epsilon).")
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="Upper clip range (1 + epsilon_high); DAPO's clip-higher uses 0.28. Unset: epsilon.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description=(
            "Weight of the KL penalty toward the reference model (GRPO's beta; 0, the default as in DAPO and "
            "Dr. GRPO, computes no reference)."
        ),
    )
    reference: Literal["auto", "base", "copy"] = Field(
        "auto",
        description=(
            "The KL reference when kl_coef > 0: 'base' (the model with its LoRA adapter off, no second model), "
            "'copy' (a frozen copy of the starting weights loaded beside the policy), 'auto' (base for LoRA, copy "
            "for full fine-tuning)."
        ),
    )
    rewards: list[RewardConfig] = Field(
        default_factory=lambda: [RewardConfig(function="math")],
        min_length=1,
        description=(
            "The reward functions; a completion's reward is their weighted sum. Each is logged as rl/reward/<name>. "
            "A function that raises scores that sample 0 and is counted in rl/reward_errors/<name>."
        ),
    )

    @property
    def clip_high(self) -> float:
        """The upper clip range."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high
