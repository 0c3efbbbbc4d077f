"""``rayft chat SOURCE``: talk to a model in this process, with the chat template it was trained with.

Reads top to bottom: resolve the source (a run directory picks its checkpoint; a LoRA checkpoint
runs on its base model with the adapter applied, unmerged), load it once with the Hugging Face
backend, then hold the session (:func:`rayft.inference.chat.chat_session`: read a line, decide,
stream the reply; Ctrl-C stops a reply, never the session). No Ray is started.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayft.config import RayftConfig
from rayft.inference.chat import ChatIO, chat_session, load_model, terminal_io

__all__ = ["ChatIO", "ChatResult", "run"]


@dataclass(frozen=True)
class ChatResult:
    """What a ``rayft chat`` session did: the replies the model gave, and the model that gave them."""

    replies: int
    model: str


def run(cfg: RayftConfig, source: str, *, device: str | None = None, io: ChatIO | None = None) -> ChatResult:
    """Chat with ``source`` until the user quits; what the session did."""
    io = io or terminal_io()
    backend, resolved = load_model(cfg, source, device)
    described = resolved.describe()
    return ChatResult(chat_session(backend, described, cfg.inference, io), described)
