"""``rayft chat SOURCE``: talk to a model in this process, with the chat template it was trained with.

Reads top to bottom: resolve the source (a run directory picks its checkpoint; a LoRA checkpoint
runs on its base model with the adapter applied, unmerged), load it once with the Hugging Face
backend, then hold the session (:func:`rayft.inference.chat.chat_session`: read a line, decide,
stream the reply; Ctrl-C stops a reply, never the session). No Ray is started.
"""

from __future__ import annotations

from rayft.config import RayftConfig
from rayft.inference.chat import ChatIO, chat_session, load_model, terminal_io

__all__ = ["ChatIO", "run"]


def run(cfg: RayftConfig, source: str, *, device: str | None = None, io: ChatIO | None = None) -> int:
    """Chat with ``source`` until the user quits; returns the number of replies generated."""
    io = io or terminal_io()
    backend, resolved = load_model(cfg, source, device)
    return chat_session(backend, resolved.describe(), cfg.inference, io)
