"""The seam every text generator sits behind (SDG teachers, evaluation, export checks).

A backend turns a batch of prompts into a batch of generations. Implementations: Hugging Face
``generate`` (CPU or GPU, in :mod:`rayft.generation.hf`), and others in sibling modules. Failures
of single prompts come back as generations with ``error`` set, never as empty text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Message = dict[str, str]
Prompt = str | list[Message]
"""A raw text prompt, or a chat conversation rendered with the model's chat template (a
:class:`ToolChat` also carries the tools the model may call)."""


class ToolChat(list[Message]):
    """A chat conversation that carries the tools the model may call (OpenAI function schemas): rendered
    with them by :func:`rayft.data.tokenize.render_chat`, as training renders a row's ``tools``. It is a
    list of messages, so that every backend, pool and record that takes a chat prompt takes it as one;
    its messages may hold tool turns (``tool_calls``, the ``tool`` role)."""

    def __init__(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(messages)
        self.tools: tuple[dict[str, Any], ...] = tuple(tools)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled to Ray actors with its tools
        return (ToolChat, (list(self), self.tools))


def prompt_tools(prompt: Prompt) -> tuple[dict[str, Any], ...]:
    """The tools a prompt carries (none for a plain one)."""
    return prompt.tools if isinstance(prompt, ToolChat) else ()


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


def stop_prefix_len(text: str, stop: Sequence[str]) -> int:
    """Characters at the end of ``text`` that could be the start of a stop sequence (so a stream
    holds them back until the next piece says whether the stop sequence follows)."""
    longest = 0
    for s in stop:
        for size in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:size]):
                longest = size
                break
    return longest


class StopFilter:
    """Streams text pieces without the stop sequences: :meth:`feed` returns what is safe to show,
    :attr:`stopped` says a stop sequence was reached (nothing more is shown), :meth:`flush` the rest."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)
        self.text = ""
        self.shown = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The part of the text so far that can be shown now."""
        if self.stopped:
            return ""
        self.text += piece
        cut, self.stopped = truncate_at_stop(self.text, self.stop)
        end = len(cut) if self.stopped else len(self.text) - stop_prefix_len(self.text, self.stop)
        return self._show(end)

    def flush(self) -> str:
        """What was held back, at the end of the stream."""
        return "" if self.stopped else self._show(len(self.text))

    def _show(self, end: int) -> str:
        out = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return out


def generate_batch(backend: GenerationBackend, params: SamplingParams, prompts: list[Prompt]) -> list[Generation]:
    """One generation per prompt; a batch that raises becomes rows with its error, never lost rows."""
    try:
        return backend.generate(prompts, params)
    except Exception as exc:
        return [Generation("", finish_reason="error", error=f"{type(exc).__name__}: {exc}")] * len(prompts)
