"""The handle of a running ``rayft serve``: where it listens, what it serves, and how it stops."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class ServeHandle:
    """A running OpenAI-compatible endpoint; a context manager that shuts it down on exit.

    Attributes:
        base_url: The OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1`` (``openai.OpenAI(base_url=...)``).
        model_ids: The ids the endpoint answers to (``model=`` of a request), base models first.
        served_from: What each source's model id loads (a pipeline's final model, a checkpoint, a name).
    """

    base_url: str
    model_ids: list[str]
    served_from: dict[str, str] = field(default_factory=dict)
    _resources: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    def shutdown(self) -> None:
        """Stop serving: requests in flight finish first; a Ray started for this endpoint stops too."""
        self._resources.close()

    def __enter__(self) -> ServeHandle:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()
