"""Config section for a custom task: a model other than a causal LM, trained by the same loop."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from rayft.config.base import Section

# "package.module:Class" or "path/to/file.py:Class"
_TASK_PATH = re.compile(r"^(?:[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*|[^:]+\.py):[A-Za-z_][\w]*$")


class TaskConfig(Section):
    """A custom task (:class:`rayft.custom.CustomTask`): it builds the model, the datasets, the
    batches, the loss and the metrics; rayft runs the loop, the workers, checkpoints, resume,
    fault tolerance and tracking. Unset (the default), ``rayft train`` fine-tunes ``model`` on ``data``."""

    path: str | None = Field(
        None,
        description=(
            "The task class, as 'package.module:Class' (importable on every worker) or 'path/to/file.py:Class' "
            "(relative to the working directory, e.g. examples/digits_cnn/task.py:DigitsTask). When set, the "
            "model, lora and data sections are not used and may not be written."
        ),
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Keyword arguments of the task class's constructor (its own hyper-parameters, e.g. {width: 32}); "
            "the class validates them."
        ),
    )

    @field_validator("path")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is None or _TASK_PATH.match(value):
            return value
        raise ValueError(
            f"task.path={value!r} is not 'package.module:Class' nor 'path/to/file.py:Class'; write the module (or "
            "the .py file) and the class name separated by a colon"
        )
