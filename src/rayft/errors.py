"""The exception tree of rayft.

Every error a user can cause derives from :class:`RayftError`. Messages say what went wrong, where,
the bad value, and how to fix it; the CLI prints them without a traceback unless ``--debug``.
"""

from __future__ import annotations

from collections.abc import Iterator


class RayftError(Exception):
    """Base class of every error rayft raises on purpose."""


class ConfigError(RayftError):
    """The configuration is invalid: unknown keys, bad values, malformed overrides."""


class DataError(RayftError):
    """A dataset cannot be read or turned into training examples."""


class ModelError(RayftError):
    """A model or tokenizer cannot be found or loaded."""


class ResourceError(RayftError):
    """The cluster cannot give what a run asks for (CPUs, GPUs, memory)."""


class CheckpointError(RayftError):
    """A checkpoint is missing, incomplete, corrupted, or does not match the run."""


class RunStateError(RayftError):
    """The run directory is in a state that forbids the requested action (say, reuse without --resume)."""


class ClusterError(RayftError):
    """A Ray cluster cannot be reached or used: a wrong address, a refused token, no Jobs API."""


class EndpointError(RayftError):
    """An OpenAI-compatible server cannot be reached, refuses the key, or does not serve the model asked for."""


class StorageError(RayftError):
    """The storage path cannot be written or read."""


class MissingDependencyError(RayftError):
    """An optional dependency is needed but not installed; the message holds the install line."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package '{package}', which is not installed. "
            f"Install it with: pip install 'rayft[{extra}]'"
        )
        self.package = package
        self.extra = extra


class TrainingError(RayftError):
    """Training failed in a way retries cannot fix (a repeated failure, a hung collective)."""


class WorkersLostError(TrainingError):
    """Processes of a training run died (killed, out of memory, their node lost) more often than
    ``failure.max_failures`` allows; ``--resume`` continues from the last checkpoint."""

    def __init__(self, summary: str, *, checkpoint_step: int | None, advice: str = "") -> None:
        self.summary = summary
        self.checkpoint_step = checkpoint_step
        self.advice = advice
        super().__init__(self.paragraph("rerun the same command with --resume"))

    def paragraph(self, resume_command: str) -> str:
        """The whole message, with the command that continues the run (``rayft train CONFIG --resume``)."""
        if self.checkpoint_step is None:
            where = f"No checkpoint was committed; start it again with:\n    {resume_command}"
        else:
            where = f"The last checkpoint is step {self.checkpoint_step}; continue from it with:\n    {resume_command}"
        return "\n".join(part for part in (self.summary, where, self.advice) if part)


class RunInterruptedError(RayftError):
    """The run stopped on request (SIGTERM) after saving a checkpoint; ``--resume`` continues it."""


def first_line(error: object) -> str:
    """The first line of an error's message (its type's name when it has none): what a one-line report quotes
    of a library's error, whose message may hold a whole response body or a server's traceback."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """An exception, then what caused it, outermost first (``cause`` attributes of Ray's wrapped errors,
    ``__cause__`` and ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        nxt = getattr(current, "cause", None) or current.__cause__ or current.__context__
        current = nxt if isinstance(nxt, BaseException) else None
