"""Ranking trials on an evaluation task's metric: ``tune.metric: eval_task/<name>``.

Which metric names a trial reports is decided here without Ray or torch (:func:`known_metrics`,
:func:`check_metric`): the training loop's ``train/loss`` and ``eval/loss`` (a custom task's
``eval/<name>`` too), and, for a language model, the metrics of ``eval.task`` as
``eval_task/<name>``. With such a metric every trial scores each checkpoint it reports with the
evaluation task (:class:`CheckpointScorer`: the HF backend, in the trial's own process, on
``tune.eval_rows`` rows of ``eval.datasets``) and reports the scores with the checkpoint's
metrics, so that ASHA, HyperBand and PBT decide on them. The scores are kept in the trial's run
directory (:data:`SCORES_FILE`): a finished trial reports them again when a sweep is restored.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayft.config import RayftConfig
from rayft.errors import CheckpointError, ConfigError
from rayft.evaluation.runner import load_examples, run_model
from rayft.evaluation.tasks import build_task
from rayft.models.sources import resolve_source
from rayft.runs import layout
from rayft.runs.location import RunLocation
from rayft.runs.store import open_store
from rayft.security import redact

if TYPE_CHECKING:
    from rayft.config.evaluation import EvalConfig
    from rayft.evaluation.runner import Examples
    from rayft.evaluation.tasks import Task

log = logging.getLogger("rayft.tune")

EVAL_TASK_PREFIX = "eval_task/"
"""Names an evaluation task's metric in ``tune.metric``: ``eval_task/accuracy_flexible``."""
SCORES_FILE = "task_scores.jsonl"
"""In a trial's run directory: one line per scored checkpoint (step, checkpoint, scores)."""
TRAINING_METRICS = ("train/loss", "eval/loss")
"""What every training run reports with a checkpoint (eval/loss with validation data)."""
LOWER_IS_BETTER = frozenset({"invalid_sql_rate"})
"""Evaluation-task metrics where a lower value is better; for the others higher is better."""


def eval_task_metric(metric: str) -> str | None:
    """The evaluation task's metric that ``metric`` names (``eval_task/<name>``), else None."""
    return metric.removeprefix(EVAL_TASK_PREFIX) if metric.startswith(EVAL_TASK_PREFIX) else None


def known_metrics(cfg: RayftConfig) -> list[str]:
    """Every metric name a trial of ``cfg`` can report; ``prefix/*`` stands for any name under it
    (what a custom task's ``metrics()`` or a custom eval metric returns)."""
    names = list(TRAINING_METRICS)
    if cfg.task.path is not None:  # its model is no language model for an evaluation task
        return [*names, "eval/*"]
    kinds = build_task(cfg.eval).kinds
    return names + ([f"{EVAL_TASK_PREFIX}{name}" for name in kinds] or [f"{EVAL_TASK_PREFIX}*"])


def _matches(metric: str, names: list[str]) -> bool:
    return any(metric == n or (n.endswith("/*") and metric.startswith(n[:-1]) and metric != n[:-1]) for n in names)


def check_metric(cfg: RayftConfig) -> None:
    """Refuse a ``tune.metric`` that no source of the run reports, and a default ``mode: min`` on
    an evaluation-task metric where higher is better, before anything starts.

    Raises:
        ConfigError: naming the metric, the names the run reports and the fix.
    """
    assert cfg.tune is not None
    metric, names = cfg.tune.metric, known_metrics(cfg)
    if not _matches(metric, names):
        raise ConfigError(f"tune.metric={metric!r} is reported by no source of this run; {_metric_fix(cfg, names)}")
    name = eval_task_metric(metric)
    if name is not None and "mode" not in cfg.tune.model_fields_set and name not in LOWER_IS_BETTER:
        raise ConfigError(
            f"tune.metric={metric!r} is better when higher, but tune.mode is not set and defaults to min; "
            "set tune.mode=max (or tune.mode=min if a lower value is what you want)"
        )


def _metric_fix(cfg: RayftConfig, names: list[str]) -> str:
    metric = cfg.tune.metric if cfg.tune is not None else ""
    known = f"it reports {', '.join(names)}"
    if eval_task_metric(metric) is not None and cfg.task.path is not None:
        return (
            f"{known}. A custom task's model is not a language model that an evaluation task can score; "
            "tune on eval/loss or on one of the task's eval/<name> metrics"
        )
    leaf = metric.rsplit("/", 1)[-1]
    guesses = [n for n in names if leaf and leaf in n.rsplit("/", 1)[-1]] or difflib.get_close_matches(metric, names)
    hint = f"Did you mean {' or '.join(guesses[:3])}? " if guesses else ""
    return (
        f"{known} (eval_task/<name>: the metrics of eval.task={cfg.eval.task}). {hint}Set tune.metric to one of "
        "them, or eval.task to the evaluation task that scores it"
    )


def trial_eval_config(cfg: RayftConfig) -> EvalConfig:
    """The evaluation a trial runs on its checkpoints: ``eval`` on ``tune.eval_rows`` rows (else
    ``eval.max_samples``), generating with the HF backend in the trial's own process."""
    assert cfg.tune is not None
    rows = cfg.tune.eval_rows or cfg.eval.max_samples
    return cfg.eval.model_copy(update={"max_samples": rows, "backend": "hf", "num_workers": 1, "runtime": "local"})


@dataclass
class CheckpointScorer:
    """Scores a trial's checkpoints with the evaluation task; loads the examples once."""

    cfg: RayftConfig
    location: RunLocation
    _loaded: tuple[Task, Examples, EvalConfig] | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_trial(cls, cfg: RayftConfig, location: RunLocation) -> CheckpointScorer | None:
        """A scorer when ``tune.metric`` names an evaluation task's metric, else None."""
        if cfg.tune is None or eval_task_metric(cfg.tune.metric) is None:
            return None
        return cls(cfg, location)

    @property
    def run_dir(self) -> Path:
        """The trial's run directory (its mirror when the sweep is on a URI)."""
        return self.location.local_dir

    def __call__(self, checkpoint: str) -> dict[str, float]:
        """Score the reported checkpoint (its path as Ray Train reports it); records the scores."""
        task, examples, ev = self._examples()
        name = Path(checkpoint).name
        with self._local(name) as directory:
            source = resolve_source(str(directory), self.cfg.model)
            run = run_model(name, source, examples, task=task, ev=ev, runtime="local")
        scores = {f"{EVAL_TASK_PREFIX}{metric}": float(e.value) for metric, e in run.metrics.items()}
        step = layout.parse_step_dir_name(name)
        record = {"step": step, "checkpoint": name, "rows": len(examples.items), "scores": scores}
        with (self.run_dir / SCORES_FILE).open("a", encoding="utf-8") as out:
            out.write(redact(json.dumps(record)) + "\n")
        log.info("tune: %s of %s on %d rows: %s", self.cfg.eval.task, name, len(examples.items), scores)
        return scores

    def _examples(self) -> tuple[Task, Examples, EvalConfig]:
        if self._loaded is None:
            ev = trial_eval_config(self.cfg)
            task = build_task(ev)
            self._loaded = task, load_examples(ev, task), ev
        return self._loaded

    @contextlib.contextmanager
    def _local(self, name: str) -> Iterator[Path]:
        """The checkpoint as a local directory: in the run directory, else downloaded from its URI."""
        local = self.run_dir / layout.CHECKPOINTS_DIR / name
        if local.is_dir():
            yield local
            return
        with tempfile.TemporaryDirectory(prefix="rayft-score-") as scratch:
            if not open_store(self.location).copy_checkpoint(name, Path(scratch) / name):
                raise CheckpointError(
                    f"tune: the checkpoint {local} was pruned before the evaluation task scored it (scoring is "
                    "slower than training between two reports); raise checkpoint.num_to_keep or lower tune.eval_rows"
                )
            yield Path(scratch) / name


def recorded_scores(run_dir: Path, step: int) -> dict[str, float]:
    """The evaluation-task scores recorded for the checkpoint of ``step`` ({} when none)."""
    path = run_dir / SCORES_FILE
    if not path.is_file():
        return {}
    found: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("step") == step:
            found = record.get("scores", {})
    return {str(k): float(v) for k, v in found.items()}
