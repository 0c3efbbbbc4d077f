"""A chat session with a loaded model: read a line, let :func:`rayft.inference.conversation.step`
decide, and stream the reply token by token. Ctrl-C during a reply stops that reply (what was shown
stays in the history); Ctrl-D, /exit or the end of the input ends the session. The model runs in
this process with the Hugging Face backend; no Ray is started."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from rayft.config import RayftConfig
from rayft.config.inference import InferenceConfig
from rayft.generation.backend import SamplingParams
from rayft.generation.factory import sampling_params
from rayft.generation.hf import HFBackend
from rayft.inference.conversation import Conversation, fit_history, step
from rayft.models.sources import ResolvedSource, resolve_source

log = logging.getLogger("rayft.chat")


@dataclass(frozen=True)
class ChatIO:
    """Where the session reads lines and writes replies (stdout) and notes (stderr)."""

    read_line: Callable[[], str | None]
    replies: TextIO
    notes: TextIO


class TurnResult(Protocol):
    """What the tools answer a reply with (:class:`rayft.environments.StepResult` is one)."""

    @property
    def messages(self) -> Sequence[dict[str, Any]]: ...
    @property
    def done(self) -> bool: ...


class ChatTools(Protocol):
    """Tools the model may call in a chat: their schemas, and an episode per user message that runs the
    calls of each reply (the tools environment, :class:`rayft.environments.ToolsEnvironment`, is one)."""

    @property
    def schemas(self) -> list[dict[str, Any]]: ...
    def reset(self, row: dict[str, Any]) -> Any: ...
    def step(self, model_turn: str) -> TurnResult: ...


def load_model(cfg: RayftConfig, source: str, device: str | None = None) -> tuple[HFBackend, ResolvedSource]:
    """Resolve ``source`` and load it for chat (on ``device``; default: a GPU when there is one)."""
    resolved = resolve_source(source, cfg.model, cfg.eval.checkpoint)
    log.info("chat: loading %s", resolved.describe())
    backend = HFBackend(resolved.model, adapter_path=resolved.adapter_path, device=device, batch_size=1)
    return backend, resolved


def chat_session(
    backend: HFBackend, described: str, inference: InferenceConfig, io: ChatIO, tools: ChatTools | None = None
) -> int:
    """Chat with the loaded model until the user quits; returns the number of replies generated. With
    ``tools``, the model is shown their schemas, and a reply that calls them is answered with their results
    (printed as notes) and replied to again, until a reply calls none or the tools' limits end the turn."""
    params = sampling_params(inference)
    io.notes.write(f"Chatting with {described}. /help lists the commands; /exit or Ctrl-D quits.\n")
    io.notes.flush()
    conversation = Conversation(inference.system_prompt, tools=tuple(tools.schemas) if tools else ())
    replies = 0
    while True:
        line = _read(io)
        if line is None:
            return replies
        decided = step(conversation, line)
        conversation = decided.conversation
        if decided.action == "exit":
            return replies
        if decided.action == "print":
            io.notes.write(decided.text + "\n")
            io.notes.flush()
        elif decided.action == "generate":
            conversation, answered = _turn(backend, conversation, params, io, tools)
            replies += answered


def _turn(
    backend: HFBackend, conversation: Conversation, params: SamplingParams, io: ChatIO, tools: ChatTools | None = None
) -> tuple[Conversation, int]:
    """One reply to the user's last line: the conversation after it, and 1 if a reply was made.

    Ctrl-C anywhere in the turn stops the reply, never the session: before the first token (while
    the history is fitted and the prompt encoded) the turn is dropped, during streaming the reply
    keeps what was shown.
    """
    try:
        asked = fit_to_context(backend, conversation, params, io.notes)
    except KeyboardInterrupt:
        io.notes.write("\n(reply stopped)\n")
        return conversation.without_last_turn(), 0
    try:
        return answer(backend, asked, params, io, tools), 1
    except Exception as exc:  # the session goes on without this turn
        io.notes.write(f"(no reply: {type(exc).__name__}: {exc}; try again, or /reset)\n")
        return asked.without_last_turn(), 0


def _read(io: ChatIO) -> str | None:
    """The next line, None at the end of the input; Ctrl-C at the prompt discards the line."""
    while True:
        try:
            return io.read_line()
        except KeyboardInterrupt:
            io.notes.write("\n(Ctrl-C: line discarded; /exit or Ctrl-D quits)\n")
        except EOFError:
            return None


def fit_to_context(
    backend: HFBackend, conversation: Conversation, params: SamplingParams, notes: TextIO
) -> Conversation:
    """The conversation, its oldest exchanges dropped when the prompt and the reply would not fit."""
    context = backend.context_tokens()
    if context is None:
        return conversation
    fitted = fit_history(conversation, backend.count_tokens, context - params.max_new_tokens)
    dropped = len(conversation.turns) - len(fitted.turns)
    if dropped:
        notes.write(f"(the oldest {dropped // 2} exchange(s) no longer fit the model's {context} tokens: dropped)\n")
    return fitted


def answer(
    backend: HFBackend, asked: Conversation, params: SamplingParams, io: ChatIO, tools: ChatTools | None
) -> Conversation:
    """The conversation after the model's answer to the user's last line: one reply, or with tools, each
    reply's calls answered with their results and replied to again until a reply calls none."""
    text = reply(backend, asked, params, io)
    if tools is None:
        return asked.with_reply(text)
    tools.reset({"messages": asked.messages()})
    result, conversation = tools.step(text), asked
    while not result.done:
        results = [str(m.get("content", "")) for m in result.messages]
        for message in result.messages:
            io.notes.write(f"[{message.get('name', 'tool')}] {message.get('content', '')}\n")
        conversation = conversation.with_reply(text).with_tool_results(results)
        text = reply(backend, conversation, params, io)
        result = tools.step(text)
    return conversation.with_reply(text)


def reply(backend: HFBackend, conversation: Conversation, params: SamplingParams, io: ChatIO) -> str:
    """Stream the model's reply to ``conversation`` to ``io.replies``; Ctrl-C stops it early."""
    stop = threading.Event()
    pieces: list[str] = []
    stream: Generator[str, None, None] | None = None
    try:
        stream = backend.stream(conversation.prompt(), params, stop)
        for piece in stream:
            pieces.append(piece)
            io.replies.write(piece)
            io.replies.flush()
    except KeyboardInterrupt:
        stop.set()
        if stream is not None:
            stream.close()  # ends the generation thread
        io.notes.write("\n(reply stopped)")
        io.notes.flush()
    io.replies.write("\n")
    io.replies.flush()
    return "".join(pieces)


def terminal_io() -> ChatIO:
    """Standard input and output; on a terminal, a prompt with line editing and history."""
    if sys.stdin.isatty():
        import readline  # noqa: F401  (gives input() line editing and history)

        def read_line() -> str | None:
            return input("> ")

    else:

        def read_line() -> str | None:
            line = sys.stdin.readline()
            return line if line else None

    return ChatIO(read_line, sys.stdout, sys.stderr)
