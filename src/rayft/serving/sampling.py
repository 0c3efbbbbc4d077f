"""How one row of a serving batch picks its next token from the model's raw logits.

The order is vLLM's, so that a request means the same on either backend: the penalties on the raw
logits (``repetition_penalty`` over the prompt's and the completion's tokens; ``presence_penalty`` and
``frequency_penalty`` over the completion's), then the constraint's allowed tokens (structured output:
every other token gets no probability), then greedy (``temperature`` 0) or, at a temperature,
``min_p``, ``top_k`` and ``top_p`` on the tempered distribution and one draw from the row's own
generator. A row with none of these settings costs nothing beyond the plain draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class Constraint(Protocol):
    """What a row's output must match (a grammar): the tokens allowed next, and the token taken."""

    def allowed(self, width: int) -> torch.Tensor:
        """A bool mask of ``width`` entries (the logits' width): the tokens that keep the output valid."""
        ...

    def advance(self, token: int) -> None:
        """Take the picked token (every token the row samples but its end of sequence)."""
        ...


@dataclass(frozen=True)
class Penalties:
    """The penalties of one request, as OpenAI (presence, frequency) and vLLM (repetition) define them."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0

    def any(self) -> bool:
        """Whether any penalty changes the logits."""
        return bool(self.presence or self.frequency or self.repetition != 1.0)


@dataclass
class Sampler:
    """How one row picks its tokens: greedy at temperature 0, else sampling with its own generator."""

    temperature: float
    top_p: float
    seed: int | None
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    penalties: Penalties = field(default_factory=Penalties)
    prompt_ids: list[int] = field(default_factory=list)  # for repetition_penalty
    constraint: Constraint | None = None
    generator: torch.Generator | None = None
    _counts: dict[int, int] = field(default_factory=dict)  # the completion's tokens so far

    def __post_init__(self) -> None:
        if self.temperature > 0:
            self.generator = torch.Generator()
            if self.seed is not None:
                self.generator.manual_seed(self.seed)
            else:
                self.generator.seed()

    @property
    def plain_greedy(self) -> bool:
        """Whether the row takes the raw logits' argmax (the batch computes those for all rows at once)."""
        return self.temperature <= 0 and self.constraint is None and not self.penalties.any()

    def pick(self, logits: torch.Tensor) -> int:
        """The next token of one row, from its raw logits (``[vocab]``)."""
        logits = self._processed(logits)
        if self.temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.min_p > 0:
            probs = probs.masked_fill(probs < self.min_p * probs.max(), 0.0)
        if 0 < self.top_k < probs.shape[-1]:
            kth = probs.topk(self.top_k).values[-1]
            probs = probs.masked_fill(probs < kth, 0.0)
        if self.top_p < 1.0:
            ordered, order = probs.sort(descending=True)
            if self.min_p > 0 or self.top_k > 0:
                ordered = ordered / ordered.sum()  # the nucleus is taken of what min_p and top_k left
            beyond = ordered.cumsum(-1) - ordered > self.top_p  # tokens after the nucleus is complete
            ordered[beyond] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, ordered)
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def taken(self, token: int) -> None:
        """Record the row's new token (for the penalties) and advance its constraint."""
        if self.penalties.any():
            self._counts[token] = self._counts.get(token, 0) + 1
        if self.constraint is not None:
            self.constraint.advance(token)

    def _processed(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.penalties.any() and self.constraint is None:
            return logits
        logits = logits.float().clone()
        penalties = self.penalties
        if penalties.repetition != 1.0:
            seen = torch.tensor(sorted({*self.prompt_ids, *self._counts}), dtype=torch.long, device=logits.device)
            seen = seen[seen < logits.shape[-1]]
            values = logits[seen]
            logits[seen] = torch.where(values > 0, values / penalties.repetition, values * penalties.repetition)
        if (penalties.presence or penalties.frequency) and self._counts:
            tokens = torch.tensor(list(self._counts), dtype=torch.long, device=logits.device)
            counts = torch.tensor(list(self._counts.values()), dtype=logits.dtype, device=logits.device)
            logits[tokens] -= penalties.frequency * counts + penalties.presence
        if self.constraint is not None:
            logits.masked_fill_(~self.constraint.allowed(logits.shape[-1]).to(logits.device), float("-inf"))
        return logits
