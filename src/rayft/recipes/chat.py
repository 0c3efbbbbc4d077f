"""``rayft chat SOURCE``: talk to a model in this process, with the chat template it was trained with.

Reads top to bottom: resolve the source (a run directory picks its checkpoint; a LoRA checkpoint
runs on its base model with the adapter applied, unmerged), load it once with the Hugging Face
backend, then hold the session (:func:`rayft.inference.chat.chat_session`: read a line, decide,
stream the reply; Ctrl-C stops a reply, never the session). With ``tools``, the model may call the
built-in tools (:mod:`rayft.environments`): a reply's calls are run and answered, and the model replies
again. No Ray is started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from rayft.config import RayftConfig
from rayft.config.environment import EnvironmentConfig
from rayft.environments import ToolsEnvironment, build_environment
from rayft.errors import ConfigError
from rayft.inference.chat import ChatIO, chat_session, load_model, terminal_io

__all__ = ["ChatIO", "ChatResult", "run"]


@dataclass(frozen=True)
class ChatResult:
    """What a ``rayft chat`` session did: the replies the model gave, and the model that gave them."""

    replies: int
    model: str


def run(
    cfg: RayftConfig, source: str, *, device: str | None = None, io: ChatIO | None = None, tools: Sequence[str] = ()
) -> ChatResult:
    """Chat with ``source`` until the user quits, with the built-in ``tools`` the model may call; what the
    session did."""
    environment = tools_environment(tools) if tools else None  # a bad name is said before the model loads
    io = io or terminal_io()
    backend, resolved = load_model(cfg, source, device)
    described = resolved.describe()
    return ChatResult(chat_session(backend, described, cfg.inference, io, environment), described)


def tools_environment(tools: Sequence[str]) -> ToolsEnvironment:
    """The tools environment of the built-in tools named (its limits per answer are the section's defaults)."""
    try:
        cfg = EnvironmentConfig.model_validate({"tools": list(tools)})
    except ValidationError as exc:
        raise ConfigError(f"--tool {list(tools)}: {exc.errors()[0]['msg']}; the tools are calculator, sql and "
                          "python") from None  # fmt: skip
    environment = build_environment(cfg, field="--tool")
    assert isinstance(environment, ToolsEnvironment)  # type 'tools' builds one
    return environment
