"""``rayft.api.chat``, which ``rayft chat`` calls: a scripted session on the tiny model, in this process."""

from __future__ import annotations

import io
from pathlib import Path

import rayft
from rayft import api
from rayft.config import load_config
from rayft.inference.chat import ChatIO


def test_api_chat_answers_each_message_until_exit(tiny_model_dir: Path) -> None:
    lines = iter(["What is 2 + 3?", "/reset", "And 4 + 4?", "/exit", "never read"])
    replies, notes = io.StringIO(), io.StringIO()
    cfg = load_config(None, ["inference.max_new_tokens=3", "inference.temperature=0"])

    result = api.chat(cfg, tiny_model_dir, device="cpu", io=ChatIO(lambda: next(lines), replies, notes))

    assert isinstance(result, rayft.ChatResult) and result.replies == 2
    assert result.model == str(tiny_model_dir.resolve())
    assert replies.getvalue()  # the random model's replies (up to 3 tokens each, often whitespace)
    assert next(lines) == "never read"  # /exit ended the session
