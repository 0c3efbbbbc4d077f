"""The chat session's state machine (commands, history, context fitting) and the streamed stop filter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rayft.generation.backend import StopFilter, stop_prefix_len
from rayft.inference.conversation import Conversation, fit_history, step


def _run(lines: list[str], start: Conversation | None = None) -> tuple[Conversation, list[str]]:
    """Feed lines, answering every user message with 'reply N'; the actions taken, in order."""
    conversation, actions = start or Conversation(), []
    for line in lines:
        decided = step(conversation, line)
        actions.append(decided.action)
        conversation = decided.conversation
        if decided.action == "generate":
            conversation = conversation.with_reply(f"reply {actions.count('generate')}")
    return conversation, actions


def test_messages_alternate_after_the_system_prompt() -> None:
    conversation, actions = _run(["hi", "", "  ", "and then?"], Conversation("Be brief."))
    assert actions == ["generate", "nothing", "nothing", "generate"]
    assert conversation.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "reply 1"},
        {"role": "user", "content": "and then?"},
        {"role": "assistant", "content": "reply 2"},
    ]


def test_reset_keeps_the_system_prompt_and_system_starts_over() -> None:
    conversation, _ = _run(["hi", "/reset"], Conversation("Be brief."))
    assert conversation == Conversation("Be brief.")
    conversation, _ = _run(["hi", "/system   You are a pirate.  ", "ahoy"])
    assert conversation.messages() == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "ahoy"},
        {"role": "assistant", "content": "reply 2"},
    ]


@pytest.mark.parametrize(
    ("line", "action", "text"),
    [
        ("/exit", "exit", ""),
        ("/quit", "exit", ""),
        ("/system", "print", "system prompt: 'Be brief.'; set it with /system TEXT"),
        ("/help", "print", "/system TEXT  set the system prompt"),
        ("/sytem hi", "print", "unknown command '/sytem'; the commands are:\n  /reset"),
    ],
)
def test_commands_say_what_they_did(line: str, action: str, text: str) -> None:
    start = Conversation("Be brief.", (("user", "hi"), ("assistant", "hello")))
    decided = step(start, line)
    assert (decided.action, decided.conversation) == (action, start)
    assert text in decided.text


def test_a_message_keeps_its_inner_whitespace_and_a_slash_inside_is_text() -> None:
    decided = step(Conversation(), "  indented, with a/slash\n")
    assert decided.conversation.turns == (("user", "  indented, with a/slash"),)


def test_fit_history_drops_the_oldest_exchanges_first() -> None:
    turns = (("user", "a" * 10), ("assistant", "b" * 10), ("user", "c" * 10), ("assistant", "d" * 10), ("user", "e"))
    conversation = Conversation("sys", turns)

    def count(messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) for m in messages)

    assert fit_history(conversation, count, 100) == conversation
    assert fit_history(conversation, count, 30).turns == turns[2:]
    assert fit_history(conversation, count, 10).turns == turns[4:]
    assert fit_history(conversation, count, 1) == Conversation("sys", turns[4:])  # the question always stays


def test_failed_reply_leaves_no_dangling_message() -> None:
    decided = step(Conversation(), "hi")
    assert decided.conversation.without_last_turn() == Conversation()


@pytest.mark.parametrize(
    ("pieces", "stop", "shown"),
    [
        (["Hel", "lo wor", "ld"], (), ["Hel", "lo wor", "ld", ""]),
        (["The answer", " is 4.\nQue", "stion: next"], ("Question:",), ["The answer", " is 4.\n", "", ""]),
        (["ab", "cX", "d"], ("abcd",), ["", "abcX", "d", ""]),
        (["x</s", "trong>"], ("</stop>",), ["x", "</strong>", ""]),
        (["done<|e", "nd|>junk"], ("<|end|>",), ["done", "", ""]),
    ],
)
def test_stop_filter_never_shows_a_stop_sequence(pieces: list[str], stop: tuple[str, ...], shown: list[str]) -> None:
    stream = StopFilter(stop)
    out = [stream.feed(piece) for piece in pieces] + [stream.flush()]
    assert out == shown
    assert "".join(out) == "".join(pieces).split(stop[0])[0] if stop else "".join(pieces)


def test_stop_prefix_len() -> None:
    assert stop_prefix_len("abc<|e", ["<|end|>", "\n\n"]) == 3
    assert stop_prefix_len("abc\n", ["<|end|>", "\n\n"]) == 1
    assert stop_prefix_len("abc", ["<|end|>"]) == 0


@pytest.mark.parametrize("command", ["chat", "generate"])
def test_option_values_are_checked_like_the_config_before_a_model_loads(command: str) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    files = ["--input", "in.jsonl", "--output", "out.jsonl"] if command == "generate" else []
    result = CliRunner().invoke(cli, [command, "some/model", *files, "--temperature", "-1", "--top-p", "2"])
    assert result.exit_code == 2
    assert "Invalid config (command-line options), 2 problem(s)" in result.output
    assert "inference.temperature" in result.output and "inference.top_p" in result.output


class _InterruptedBackend:
    """A chat backend the user interrupts: before the first token, or after ``shown`` pieces."""

    def __init__(self, shown: int | None) -> None:
        self.shown = shown

    def context_tokens(self) -> int:
        if self.shown is None:
            raise KeyboardInterrupt  # Ctrl-C while the history is fitted, before any token
        return 1000

    def count_tokens(self, messages: object) -> int:
        return 1

    def stream(self, messages: object, params: object, stop: object) -> Iterator[str]:
        yield from ["Hel", "lo"][: self.shown]
        raise KeyboardInterrupt


@pytest.mark.parametrize(("shown", "reply", "turns"), [(None, "", 0), (0, "", 2), (2, "Hello\n", 2)])
def test_ctrl_c_anywhere_in_a_turn_stops_the_reply_not_the_session(shown: int | None, reply: str, turns: int) -> None:
    import io

    from rayft.generation.backend import SamplingParams
    from rayft.inference.chat import ChatIO, _turn

    replies, notes = io.StringIO(), io.StringIO()
    chat = ChatIO(lambda: None, replies, notes)
    asked = step(Conversation(), "hi").conversation
    after, answered = _turn(_InterruptedBackend(shown), asked, SamplingParams(max_new_tokens=8), chat)  # type: ignore[arg-type]
    assert "(reply stopped)" in notes.getvalue()
    assert replies.getvalue() == ("" if shown is None else reply or "\n")
    assert len(after.turns) == turns and answered == (0 if shown is None else 1)


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


def test_with_tools_a_calling_reply_is_tool_calls_and_its_results_follow() -> None:
    asked = step(Conversation("Be brief.", tools=(ADD,)), "1 + 2?").conversation
    conversation = asked.with_reply("Adding. " + CALL).with_tool_results(["3"]).with_reply("It is 3.")
    messages = conversation.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "Adding." and messages[3] == {"role": "tool", "content": "3"}
    (sent,) = messages[2]["tool_calls"]
    assert sent["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    prompt = conversation.prompt()
    assert list(prompt) == messages and prompt.tools == (ADD,)
    bad = asked.with_reply("<tool_call>{oops</tool_call>").messages()[-1]
    assert bad == {"role": "assistant", "content": "<tool_call>{oops</tool_call>"}
    assert "tool_calls" not in Conversation(turns=(("assistant", CALL),)).messages()[0]  # no tools, no calls


def test_reset_and_system_keep_the_tools_and_fitting_drops_whole_exchanges() -> None:
    conversation = Conversation(None, (("user", "a"), ("assistant", CALL), ("tool", "3"), ("assistant", "3"),
                                       ("user", "b")), (ADD,))  # fmt: skip
    assert step(conversation, "/reset").conversation == Conversation(tools=(ADD,))
    assert step(conversation, "/system S").conversation == Conversation("S", tools=(ADD,))
    fitted = fit_history(conversation, lambda prompt: 100 * len(prompt), 150)
    assert fitted.turns == (("user", "b"),) and fitted.tools == (ADD,)
