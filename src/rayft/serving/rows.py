"""What a request receives from the engine, and one running row's decoding state that produces it.

A row's new tokens become events: pieces of text that are safe to show (a stop string is held back until
it cannot match, a character whose bytes span tokens until its last token), with their tokens'
log-probabilities where the request asked for them, then one :class:`Finished`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rayft.generation.backend import StopFilter
from rayft.serving.logprobs import TokenLogprob

if TYPE_CHECKING:
    from rayft.generation.hf import HFBackend
    from rayft.serving.batch import Picked
    from rayft.serving.protocol import Job


@dataclass(frozen=True)
class Finished:
    """The end of one request's completion: why it ended and how many tokens it took."""

    finish_reason: str
    completion_tokens: int


@dataclass(frozen=True)
class Text:
    """A piece of streamed text with its tokens' log-probabilities (sent instead of a plain ``str``
    when the request asked for ``logprobs``)."""

    text: str
    logprobs: list[TokenLogprob] | None = None


Event = str | Text | Finished
"""What a request receives: pieces of text (``str``, or :class:`Text` with log-probabilities), then one
:class:`Finished`."""


class RowRequest(Protocol):
    """What a row's decoding reads of its request (the engine's ``Prepared``)."""

    job: Job
    max_tokens: int
    cancelled: bool


class RowState:
    """One row's decoding: its tokens so far, the text shown, and whether it has finished."""

    def __init__(self, backend: HFBackend, row: RowRequest) -> None:
        self.tokenizer, self.eos = backend.tokenizer, backend.eos_ids()
        self.row, self.ids, self.count, self.shown, self.text = row, list[int](), 0, 0, ""
        self.filter = StopFilter(row.job.stop)
        self.logprobs: list[TokenLogprob] = []  # of the tokens whose text has not been sent yet
        self.wants_logprobs = bool(getattr(row.job, "logprobs", False))
        self.done = False

    def take(self, picked: Picked) -> list[Event]:
        """The events of one row's new token; its log-probabilities ride on the next piece of text."""
        if picked.logprob is not None:
            decode = self.tokenizer.decode
            top = [(str(decode([t])), value) for t, value in picked.top]
            self.logprobs.append(TokenLogprob(str(decode([picked.token])), picked.token, picked.logprob, top))
        return self.step(picked.token)

    def step(self, token: int) -> list[Event]:
        """The events of one new token: text that is safe to show, and the end when it came."""
        if self.done or self.row.cancelled:
            self.done = True  # a cancelled row's client is gone: nothing more to decode or send
            return []
        self.count += 1
        if token in self.eos:
            self.logprobs.clear()  # the end of sequence is no text: OpenAI reports no log-probability for it
            return self.finish("stop")
        self.ids.append(token)
        self.text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        # A character whose bytes span tokens decodes as U+FFFD until its last token: wait for it.
        events = [] if self.text.endswith("\ufffd") else self._show()
        if self.filter.stopped:
            return [*events, *self.finish("stop")]
        if self.count >= self.row.max_tokens:
            return [*events, *self.finish("length")]
        return events

    def _show(self) -> list[Event]:
        piece = self.filter.feed(self.text[self.shown :])
        self.shown = len(self.text)
        return [self._text(piece)] if piece else []

    def _text(self, piece: str) -> str | Text:
        if not self.wants_logprobs:
            return piece
        logprobs, self.logprobs = self.logprobs, []
        return Text(piece, logprobs)

    def finish(self, reason: str) -> list[Event]:
        """The text held back and the end, once; the text is what decoding the whole row gives."""
        if self.done:
            return []
        self.done = True
        events = self._show()
        tail = self.filter.flush()
        return [*events, *([self._text(tail)] if tail else []), Finished(reason, self.count)]
