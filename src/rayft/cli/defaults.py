"""Config defaults as the commands' help shows them, read from the config schema: a default lives in
its config field alone, and ``--help`` cannot drift from it."""

from __future__ import annotations

from pydantic import BaseModel

from rayft.config import RayftConfig


def config_default(path: str) -> str:
    """``path: value``, the default of the dotted config field ``path`` (``unset`` for None)."""
    section, _, name = path.rpartition(".")
    model: type[BaseModel] = RayftConfig
    for part in filter(None, section.split(".")):
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise KeyError(f"{path}: {part} is not a config section")
        model = annotation
    default = model.model_fields[name].get_default(call_default_factory=True)
    if default is None:
        return f"{path}: unset"
    return f"{path}: {str(default).lower() if isinstance(default, bool) else default}"


CHECKPOINT_HELP = (
    "Checkpoint of a run directory: latest, best (lowest eval/loss), final, or step-N "
    f"[{config_default('eval.checkpoint')}]."
)
"""The help of every command's ``--checkpoint`` option (it sets ``eval.checkpoint``)."""
