"""The conversation of ``rayft chat`` as a pure state machine: commands, history, prompt rendering.

Nothing here touches a model: :func:`step` turns the current :class:`Conversation` and one line
the user typed into the next conversation and what to do (print something, generate a reply,
quit); :func:`fit_history` drops the oldest turns that do not fit the model's context; the
model I/O lives in :mod:`rayft.inference.chat`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from rayft.data.tools import ToolUseError, split_tool_calls
from rayft.generation.backend import ToolChat

Message = dict[str, Any]

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
    """The system prompt, the turns so far (user and assistant, alternating; with tools, an assistant turn
    that calls them is followed by their results, ``tool`` turns, and the assistant again), and the
    tools the model may call (OpenAI function schemas)."""

    system: str | None = None
    turns: tuple[tuple[str, str], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()

    def messages(self) -> list[Message]:
        """The conversation as chat-template messages, the system prompt first; an assistant turn's calls
        as OpenAI ``tool_calls`` (so that the template renders them its own way)."""
        head: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        return head + [_message(role, text, bool(self.tools)) for role, text in self.turns]

    def prompt(self) -> ToolChat:
        """What the model answers: the messages with the tools."""
        return ToolChat(self.messages(), self.tools)

    def with_reply(self, text: str) -> Conversation:
        """The conversation with the assistant's reply appended."""
        return replace(self, turns=(*self.turns, ("assistant", text)))

    def with_tool_results(self, results: list[str]) -> Conversation:
        """The conversation with the results of the last reply's tool calls appended, in call order."""
        return replace(self, turns=(*self.turns, *(("tool", text) for text in results)))

    def without_last_turn(self) -> Conversation:
        """The conversation without its last turn (a message whose reply failed)."""
        return replace(self, turns=self.turns[:-1])


def _message(role: str, text: str, tools: bool) -> Message:
    if role != "assistant" or not tools:
        return {"role": role, "content": text}
    try:
        content, calls = split_tool_calls(text)
    except ToolUseError:  # a call that cannot be read stays the text the model wrote (and was told about)
        return {"role": role, "content": text}
    if not calls:
        return {"role": role, "content": text}
    return {"role": role, "content": content, "tool_calls": [c.to_openai(arguments_as_text=True) for c in calls]}


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
    return Step(replace(conversation, turns=()), "print", "(conversation cleared)")


def _system(conversation: Conversation, argument: str) -> Step:
    if argument:
        return Step(
            replace(conversation, system=argument, turns=()), "print", "(system prompt set; conversation cleared)"
        )
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


def fit_history(conversation: Conversation, count_tokens: Callable[[ToolChat], int], budget: int) -> Conversation:
    """The conversation without its oldest exchanges, until its prompt takes at most ``budget``
    tokens (``count_tokens`` measures the rendered prompt). The system prompt and the last user
    message always stay, even when they alone are over budget."""
    turns = conversation.turns
    while len(turns) > 2 and count_tokens(replace(conversation, turns=turns).prompt()) > budget:
        turns = _next_exchange(turns)
    return replace(conversation, turns=turns)


def _next_exchange(turns: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The turns without their first exchange: the first user message and every turn up to the next one
    (the replies and tool results that answered it)."""
    following = next((i for i, (role, _) in enumerate(turns) if i > 0 and role == "user"), len(turns) - 1)
    return turns[following:]
