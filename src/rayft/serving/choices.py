"""One choice of a response, whole or streamed, with the model's tool calls read out of its text (pure).

A request with tools (and ``tool_choice`` other than ``none``) has its output read back by
:mod:`.tools`: the calls become ``message.tool_calls`` (ids ``call_...``, arguments as JSON text) and
the finish reason ``tool_calls``; streamed, the text before a call goes out as content deltas and each
call as OpenAI's ``tool_calls`` deltas (one with its index, id and name, one with its arguments).
Without tools the text goes out as it comes.
"""

from __future__ import annotations

from typing import Any

from rayft.serving.protocol import Job, ResponseBuilder
from rayft.serving.tools import Call, CallStream, split_calls


def whole_choice(reply: ResponseBuilder, index: int, job: Job, text: str, finish_reason: str, *,
                 logprobs: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A whole response's choice; its tool calls taken out of the text when the request gave tools."""
    if reply.endpoint != "chat" or job.tools.calls is None:
        return reply.choice(index, text, finish_reason, logprobs)
    content, calls = split_calls(text, set(job.tools.calls))
    if not calls:
        return reply.choice(index, text, finish_reason, logprobs)
    calls = calls[:1] if job.tools.single_call else calls
    reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return reply.choice(index, content, reason, logprobs, [call.to_dict() for call in calls])


class ChoiceStream:
    """The stream chunks of one choice, piece by piece (see the module docstring)."""

    def __init__(self, reply: ResponseBuilder, index: int, job: Job) -> None:
        self.reply, self.index, self.job = reply, index, job
        reads_calls = reply.endpoint == "chat" and job.tools.calls is not None
        self.calls = CallStream(set(job.tools.calls or ())) if reads_calls else None
        self.called = 0
        self.logprobs: dict[str, Any] | None = None  # held until the next chunk goes out

    def piece(self, text: str, logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The chunks of one piece of text (none while a tag or a call is still incomplete)."""
        if self.calls is None:
            return [self.reply.chunk(text, index=self.index, logprobs=logprobs)]
        self._hold(logprobs)
        return self._chunks(self.calls.feed(text))

    def finish(self, finish_reason: str) -> list[dict[str, Any]]:
        """The last chunks: what was held back, then the finish reason."""
        out = self._chunks(self.calls.flush()) if self.calls is not None else []
        reason = "tool_calls" if self.called and finish_reason == "stop" else finish_reason
        out.append(self.reply.chunk(None, reason, index=self.index, logprobs=self._take()))
        return out

    def _chunks(self, parts: list[str | Call]) -> list[dict[str, Any]]:
        out = []
        for part in parts:
            if isinstance(part, str):
                if part.strip() or not self.called:  # no stray blank content between or after calls
                    out.append(self.reply.chunk(part, index=self.index, logprobs=self._take()))
            elif not (self.called and self.job.tools.single_call):
                head = {"id": part.id, "type": "function", "function": {"name": part.name, "arguments": ""}}
                out.append(self.reply.chunk(None, index=self.index, tool_call=(self.called, head),
                                            logprobs=self._take()))  # fmt: skip
                arguments = {"function": {"arguments": part.arguments}}
                out.append(self.reply.chunk(None, index=self.index, tool_call=(self.called, arguments)))
                self.called += 1
        return out

    def _hold(self, logprobs: dict[str, Any] | None) -> None:
        if logprobs is None:
            return
        if self.logprobs is None:
            self.logprobs = {"content": []}
        self.logprobs["content"] += logprobs.get("content") or []

    def _take(self) -> dict[str, Any] | None:
        held, self.logprobs = self.logprobs, None
        return held
