"""The conversation of ``rayft chat`` as a pure state machine: commands, history, prompt rendering.

Nothing here touches a model: :func:`step` turns the current :class:`Conversation` and one line
the user typed into the next conversation and what to do (print something, generate a reply,
quit); :func:`fit_history` drops the oldest turns that do not fit the model's context; the
model I/O lives in :mod:`rayft.inference.chat`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

Message = dict[str, str]

COMMANDS = {
    "/reset": "clear the conversation (the system prompt stays)",
    "/system TEXT": "set the system prompt and start over (/system alone shows it)",
    "/help": "list the commands",
    "/exit": "quit (also /quit, Ctrl-D)",
}
"""The commands a chat session understands, with what each does (shown by /help)."""

Action = Literal["generate", "print", "exit", "nothing"]


@dataclass(frozen=True)
class Conversation:
    """The system prompt and the turns so far (user and assistant, alternating)."""

    system: str | None = None
    turns: tuple[tuple[str, str], ...] = ()

    def messages(self) -> list[Message]:
        """The conversation as chat-template messages, the system prompt first."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": role, "content": text} for role, text in self.turns]

    def with_reply(self, text: str) -> Conversation:
        """The conversation with the assistant's reply appended."""
        return replace(self, turns=(*self.turns, ("assistant", text)))

    def without_last_turn(self) -> Conversation:
        """The conversation without its last turn (a message whose reply failed)."""
        return replace(self, turns=self.turns[:-1])


@dataclass(frozen=True)
class Step:
    """What one input line leads to: the next conversation, and what the session does now."""

    conversation: Conversation
    action: Action
    text: str = ""


def help_text() -> str:
    """The command list, one per line."""
    width = max(len(name) for name in COMMANDS)
    return "\n".join(f"  {name.ljust(width)}  {what}" for name, what in COMMANDS.items())


def step(conversation: Conversation, line: str) -> Step:
    """Apply one input line: a command, or a user message to answer (action 'generate')."""
    text = line.strip()
    if not text:
        return Step(conversation, "nothing")
    if not text.startswith("/"):
        return Step(replace(conversation, turns=(*conversation.turns, ("user", line.rstrip("\n")))), "generate")
    name, _, argument = text.partition(" ")
    command = _COMMANDS.get(name)
    if command is None:
        return Step(conversation, "print", f"unknown command {name!r}; the commands are:\n{help_text()}")
    return command(conversation, argument.strip())


def _exit(conversation: Conversation, argument: str) -> Step:
    return Step(conversation, "exit")


def _reset(conversation: Conversation, argument: str) -> Step:
    return Step(Conversation(conversation.system), "print", "(conversation cleared)")


def _system(conversation: Conversation, argument: str) -> Step:
    if argument:
        return Step(Conversation(argument), "print", "(system prompt set; conversation cleared)")
    shown = repr(conversation.system) if conversation.system else "none"
    return Step(conversation, "print", f"system prompt: {shown}; set it with /system TEXT")


def _help(conversation: Conversation, argument: str) -> Step:
    return Step(conversation, "print", help_text())


_COMMANDS: dict[str, Callable[[Conversation, str], Step]] = {
    "/exit": _exit,
    "/quit": _exit,
    "/reset": _reset,
    "/system": _system,
    "/help": _help,
}


def fit_history(conversation: Conversation, count_tokens: Callable[[list[Message]], int], budget: int) -> Conversation:
    """The conversation without its oldest exchanges, until its prompt takes at most ``budget``
    tokens (``count_tokens`` measures the rendered prompt). The system prompt and the last user
    message always stay, even when they alone are over budget."""
    turns = conversation.turns
    while len(turns) > 2 and count_tokens(replace(conversation, turns=turns).messages()) > budget:
        turns = turns[2:]
    return replace(conversation, turns=turns)
