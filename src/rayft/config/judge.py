"""Config of an LLM judge: a reward read from a model behind an OpenAI-compatible endpoint
(``train.rl.rewards[].judge``, with ``function: judge``)."""

from __future__ import annotations

import string

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.generation import EndpointConfig

DEFAULT_RUBRIC = (
    "You grade an answer to a task. Compare the answer with the reference answer and judge whether it is "
    "correct and complete.\n\n"
    "Task:\n{prompt}\n\n"
    "Reference answer:\n{reference}\n\n"
    "Answer to grade:\n{completion}\n\n"
    "Reply with one line of reasoning, then a last line of the form 'SCORE: <number>', where the number is "
    "from {score_min} (wrong) to {score_max} (fully correct)."
)
"""The rubric sent when none is configured: the task, the reference, the answer, and the reply's form."""

RUBRIC_FIELDS = frozenset({"prompt", "completion", "reference", "score_min", "score_max"})
"""The placeholders a rubric may use."""


class JudgeConfig(Section):
    """An LLM judge: a rubric filled with a sample's prompt, completion and reference, sent to a model behind
    any OpenAI-compatible endpoint (``rayft serve`` included); its reply's ``SCORE: <number>`` is the reward,
    mapped from [score_min, score_max] onto [0, 1]."""

    model: str = Field(..., description="The judge model's name, sent as the request's model.")
    endpoint: EndpointConfig = Field(
        default_factory=EndpointConfig,
        description=(
            "Where the judge listens and how hard to try: base_url, api_key_env (the name of the environment "
            "variable holding the key; the key itself never goes in a config), timeout_s per request, max_retries "
            "after HTTP 429, 5xx, a timeout or a dropped connection (with backoff_s doubling), and max_concurrency "
            "(judgements in flight at once)."
        ),
    )
    rubric: str = Field(
        DEFAULT_RUBRIC,
        description=(
            "The judge's prompt, sent as one user message: a Python format string with the placeholders {prompt}, "
            "{completion}, {reference}, {score_min} and {score_max} (a literal brace is written twice). It must ask "
            "for a last line 'SCORE: <number>'."
        ),
    )
    prompt_column: str = Field(
        "prompt",
        description=(
            "The data column holding each row's prompt, carried to the judge as {prompt} ('question' for GSM8K). "
            "Preparation rejects a row without it."
        ),
    )
    score_min: float = Field(0.0, description="The lowest score the rubric allows; it maps to reward 0.")
    score_max: float = Field(10.0, description="The highest score the rubric allows; it maps to reward 1.")
    fallback: float = Field(
        0.0,
        description=(
            "The reward of a sample whose judgement failed (no answer after the retries) or did not parse (no "
            "'SCORE: <number>' line, or a number outside [score_min, score_max]); such samples are counted in "
            "rl/reward_errors/<name>."
        ),
    )
    max_new_tokens: int = Field(256, gt=0, description="Longest judge reply, in tokens.")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature; 0 is greedy.")
    cache_size: int = Field(
        10000,
        ge=0,
        description=(
            "Judgements remembered (least recently used dropped first): the same model, rubric, prompt, completion "
            "and reference score again without a request. 0 turns the cache off. Failed judgements are not cached."
        ),
    )

    @model_validator(mode="after")
    def _rubric_and_range(self) -> JudgeConfig:
        if self.score_max <= self.score_min:
            raise ValueError(
                f"judge score_max {self.score_max} is not above score_min {self.score_min}; set score_max > score_min"
            )
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(self.rubric) if name is not None}
        except ValueError as exc:
            raise ValueError(
                f"judge rubric is not a valid format string ({exc}); write a literal brace twice"
            ) from None
        unknown = sorted(names - RUBRIC_FIELDS)
        if unknown:
            raise ValueError(
                f"judge rubric uses unknown placeholders {unknown}; use only {sorted(RUBRIC_FIELDS)} "
                "(a literal brace is written twice)"
            )
        if "completion" not in names:
            raise ValueError("judge rubric has no {completion} placeholder; the judge would not see the answer")
        return self
