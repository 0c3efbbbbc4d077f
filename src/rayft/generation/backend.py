"""The seam every text generator sits behind (SDG teachers, evaluation, export checks).

A backend turns a batch of prompts into a batch of generations. Implementations: Hugging Face
``generate`` (CPU or GPU, in :mod:`rayft.generation.hf`), and others in sibling modules. Failures
of single prompts come back as generations with ``error`` set, never as empty text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Message = dict[str, str]
Prompt = str | list[Message]
"""A raw text prompt, or a chat conversation rendered with the model's chat template."""

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: greedy when temperature is 0."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One generated completion, with token counts and why it ended."""

    text: str
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    finish_reason: FinishReason = "stop"
    error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    """Generates completions for a batch of prompts."""

    @property
    def name(self) -> str:
        """A short identifier recorded in provenance (e.g. 'hf:/path/to/model')."""
        ...

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, in order; per-prompt failures set ``error``."""
        ...


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first stop sequence; the flag says whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
