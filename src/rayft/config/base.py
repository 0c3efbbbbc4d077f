"""The base class of every config section: strict, documented, and immutable after loading."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: unknown keys are errors, every field carries a description.

    Sections are frozen so that a component cannot change the configuration another one reads;
    use ``model_copy(update=...)`` to derive a variant.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
