"""The checks a config gets beyond its schema, in one table: those that concern how a command uses the
whole config (which pipeline stages it names, what they need, where they write), which pydantic cannot
make because they read which sections were written.

``rayft config validate`` runs them, and each command runs the ones it needs before anything starts
(:func:`check_config`): a check that a command makes, ``validate`` makes, because there is one table.
A check belongs here, not in the command, whenever it reads the config alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rayft.config.rl_stage import rl_data_section, rl_train_section
from rayft.config.schema import RayftConfig
from rayft.errors import ConfigError, RayftError, StorageError
from rayft.security import mask_uri

STAGES = ("sdg", "tune", "train", "pairs", "preference", "rl", "eval", "export")
"""Every stage of ``rayft run``, in the order it runs."""

IMPLIES = {"tune": ("train",), "preference": ("pairs",)}
"""Stages a written section requests besides its own (a sweep is there to train its best trial;
preference training, to train on the pairs made just before it)."""

NEEDS = {
    "sdg": (),
    "tune": (),
    "train": (),
    "pairs": (),
    "preference": ("pairs",),
    "rl": (),
    "eval": (),
    "export": ("train",),
}
"""Stages whose outputs a stage cannot do without (eval compares with train when both are requested)."""

REMOTE_STAGES = ("train",)
"""Stages that can write to a URI ``storage_path`` (through a local mirror, uploaded as they go)."""

# ``scheme://`` as RFC 3986 spells it; a Windows drive letter ("C:\\") has no "//".
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(storage_path: str) -> bool:
    """Whether ``storage_path`` is a URI (handled by pyarrow) rather than a local path."""
    return bool(_URI.match(storage_path))


def requested_stages(sections_set: Iterable[str]) -> list[str]:
    """The stages named in the config, in pipeline order; an error when it names none, or names stages
    that cannot run together or without another."""
    written = set(sections_set)
    written |= {implied for s in STAGES if s in written for implied in IMPLIES.get(s, ())}
    stages = [s for s in STAGES if s in written]
    if not stages:
        raise ConfigError(
            "the config names no pipeline stage; add at least one of the sections "
            f"{', '.join(STAGES)} (an empty section like `eval: {{}}` takes the defaults)"
        )
    _check_stage_set(written)
    return stages


def _check_stage_set(written: set[str]) -> None:
    if {"preference", "rl"} <= written:
        raise ConfigError(
            "the config has both an rl and a preference section: rayft run trains one of them after SFT; remove one"
        )
    missing = [(s, n) for s in STAGES if s in written for n in NEEDS[s] if n not in written]
    if missing:
        stage, need = missing[0]
        raise ConfigError(f"stage {stage!r} needs the {need!r} stage's output; add a `{need}:` section to the config")


def check_remote_stages(requested: Iterable[str], where: str) -> None:
    """Refuse, before anything runs, stages that cannot write to the URI ``where`` (they would
    silently write only to the local mirror)."""
    local_only = [s for s in requested if s not in REMOTE_STAGES]
    if local_only:
        names = ", ".join(local_only)
        sections = ", ".join(f"`{s}:`" for s in local_only)
        raise StorageError(
            f"storage_path {where}: the {names} stage(s) of `rayft run` write only to a local directory or shared "
            f"mount, not to a URI. Use a local storage_path (or the bucket mounted as a directory), or train only "
            f"with this URI: remove the {sections} section(s), or use `rayft train`"
        )


def check_rl_stage(cfg: RayftConfig) -> None:
    """The rl stage's train and data sections are valid (a resolved config of a run without an rl stage holds
    the default section, which the run's own train and data sections could fail, so this is checked only when
    requested)."""
    try:
        rl_train_section(cfg.train, cfg.rl)
        rl_data_section(cfg.data, cfg.rl)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _names_a_stage(cfg: RayftConfig) -> None:
    requested_stages(cfg.model_fields_set)


def _stages_fit_together(cfg: RayftConfig) -> None:
    _check_stage_set(set(cfg.model_fields_set) & set(STAGES))


def _rl_stage_sections(cfg: RayftConfig) -> None:
    if "rl" in cfg.model_fields_set:  # before anything runs: its errors name rl.train.<key> or rl.data.<key>
        check_rl_stage(cfg)


def _stages_write_to_storage(cfg: RayftConfig) -> None:
    # Decided from the config alone, before any store opens: the stages that cannot write to a URI are refused.
    if is_remote(cfg.storage_path):
        written = set(cfg.model_fields_set)
        written |= {implied for s in STAGES if s in written for implied in IMPLIES.get(s, ())}
        check_remote_stages([s for s in STAGES if s in written], mask_uri(cfg.storage_path.partition("?")[0]))


def check_unread_method_sections(cfg: RayftConfig, requested: Iterable[str]) -> None:
    """Refuse ``train.rl`` or ``train.preference`` settings beside an rl or preference stage: that stage trains
    with its own section's settings, so the train section's would be silently ignored."""
    for stage in ("rl", "preference"):
        written = getattr(cfg.train, stage).model_dump(exclude_defaults=True)
        if stage in requested and written:
            key = next(iter(written))
            raise ConfigError(
                f"train.{stage}.{key}: the {stage} stage trains with its own section's settings, so this one would "
                f"be ignored; move it to {stage}.{key}"
            )


def _method_sections_read(cfg: RayftConfig) -> None:
    written = set(cfg.model_fields_set)
    check_unread_method_sections(cfg, {implied for s in written for implied in (s, *IMPLIES.get(s, ()))})


@dataclass(frozen=True)
class ConfigCheck:
    """One check of a whole config: its name, the commands that make it, and the check (which raises
    a one-line RayftError naming the dotted path or section, the bad value and the fix).

    ``asked_only``: made by ``rayft config validate`` only when it is asked for one of ``commands``
    (``--command``); a config for another command has no reason to pass it."""

    name: str
    commands: tuple[str, ...]
    check: Callable[[RayftConfig], None]
    asked_only: bool = False


CHECKS: tuple[ConfigCheck, ...] = (
    ConfigCheck("a pipeline stage is named", ("run",), _names_a_stage, asked_only=True),
    ConfigCheck("the stages named can run together", ("run",), _stages_fit_together),
    ConfigCheck("the rl stage's sections are valid", ("run",), _rl_stage_sections),
    ConfigCheck("every stage named can write to storage_path", ("run",), _stages_write_to_storage),
    ConfigCheck("no train.rl or train.preference beside the stage that ignores it", ("run",), _method_sections_read),
)
"""Every check beyond the schema, with the commands that make it."""


def check_config(cfg: RayftConfig, command: str | None = None) -> None:
    """Make the checks of ``command`` (None: those of every command, but the ``asked_only`` ones) and
    report every problem at once: one problem as its own error, several as one ConfigError listing them."""
    problems: list[RayftError] = []
    for item in CHECKS:
        wanted = command in item.commands if command is not None else not item.asked_only
        if not wanted:
            continue
        try:
            item.check(cfg)
        except RayftError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"Invalid config, {len(problems)} problem(s):\n{lines}")
