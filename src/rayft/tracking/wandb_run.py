"""Weights & Biases: rank 0's sender thread opens the run (resuming the id the driver recorded) and
logs the metric stream into it. Offline mode writes under ``<run_dir>/wandb/``, for ``wandb sync``.

A restarted worker sends the steps after the checkpoint it resumed from, under the same run id.
W&B buffers what it was given until it flushes (a process killed before that loses the tail), so no
step is skipped here on the word of an earlier attempt: online, a resumed W&B run ignores steps
below the step it already reached; offline, each attempt is a file of its own under ``wandb/``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayft.config.tracking import WandbConfig
from rayft.tracking.sender import Record

log = logging.getLogger("rayft.tracking")


def new_run_id() -> str:
    """A W&B run id (8 lowercase letters and digits, as wandb generates)."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class WandbMetricSink:
    """The metric stream of rank 0 into the W&B run ``run_id``."""

    name = "W&B"

    def __init__(
        self, cfg: WandbConfig, run_id: str, run_dir: Path, *, name: str, params: dict[str, str], tags: list[str]
    ) -> None:
        self._cfg = cfg
        self._run_id = run_id
        self._run_dir = run_dir
        self._name = name
        self._params = params
        self._tags = tags
        self._run: Any = None

    def connect(self) -> dict[str, int]:
        """Start (or resume) the run; every step of the stream is sent (nothing held)."""
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self._run = wandb.init(
            project=self._cfg.project, entity=self._cfg.entity, mode=self._cfg.mode, id=self._run_id,
            name=self._name, resume="allow", dir=str(self._run_dir), config=self._params, tags=self._tags,
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )  # fmt: skip
        return {}

    def send(self, records: Sequence[Record]) -> None:
        """Log each record at its step."""
        for step, _, metrics in records:
            self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def close(self) -> None:
        """Finish the run (offline: the files are complete for ``wandb sync``)."""
        if self._run is not None:
            self._run.finish()
