"""``rayft eval CONFIG [KEY=VALUE]... --model SRC``: score one model on the eval datasets.

Reads top to bottom: build the task, check the examples in one streamed pass, resolve the model
source (a run directory picks its checkpoint), generate on a Ray actor pool or in-process a window
at a time, score each window as it finishes (:mod:`rayft.evaluation.streaming`), and write
``eval.json`` (metrics with intervals, config, model fingerprint) and ``predictions.jsonl``.

Public entry point: :func:`run` (also ``rayft.api.evaluate``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.environments.evaluate import check_without_tools, stream_eval
from rayft.evaluation.report import console_table, model_summary
from rayft.evaluation.runner import eval_source, generation_runtime, open_examples
from rayft.evaluation.streaming import scratch_files, write_predictions
from rayft.evaluation.summary import EvalSummary, MetricSummary, ModelSummary
from rayft.evaluation.tasks import build_task
from rayft.files import check_writable_dir, write_text_atomic

log = logging.getLogger("rayft.eval")

EVAL_FILE = "eval.json"
PREDICTIONS_FILE = "predictions.jsonl"


@dataclass(frozen=True)
class EvalResult:
    """What an evaluation wrote (``eval.json``, ``predictions.jsonl``) and found (``summary``)."""

    output_dir: Path
    json_path: Path
    predictions_path: Path
    summary: EvalSummary
    table: str

    @property
    def metrics(self) -> dict[str, MetricSummary]:
        """Every metric of the model, with its interval."""
        return self.summary.model.metrics

    @property
    def primary_metric(self) -> str:
        """The task's headline metric."""
        return self.summary.model.primary_metric

    @property
    def num_examples(self) -> int:
        """How many examples were scored."""
        return self.summary.num_examples

    @property
    def model(self) -> ModelSummary:
        """What was evaluated and how it did."""
        return self.summary.model


def run(cfg: RayftConfig, source: str, output_dir: Path, *, label: str = "model") -> EvalResult:
    """Evaluate the model ``source`` on ``cfg.eval`` and write the report into ``output_dir``."""
    check_writable_dir(Path(output_dir), where="--output")  # before anything is generated
    check_without_tools(cfg.eval, [label])
    task = build_task(cfg.eval)
    examples = open_examples(cfg.eval, task)
    resolved = eval_source(source, cfg)
    output_dir = Path(output_dir)
    with scratch_files(output_dir / PREDICTIONS_FILE, 1) as (rows,), generation_runtime(cfg) as runtime:
        model_run = stream_eval(label, resolved, examples, rows, task=task, cfg=cfg, runtime=runtime)
        predictions = write_predictions(output_dir / PREDICTIONS_FILE, model_run)
    summary = EvalSummary(
        task=task.name,
        num_examples=examples.count,
        num_fewshot=len(examples.fewshot),
        skipped_rows=examples.skipped,
        confidence=cfg.eval.confidence,
        model=model_summary(model_run),
        config={"eval": json.loads(cfg.eval.model_dump_json()), "model": json.loads(cfg.model.model_dump_json())},
    )
    text = json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n"
    json_path = write_text_atomic(output_dir / EVAL_FILE, text)
    table = console_table({label: summary.model}, cfg.eval.confidence)
    return EvalResult(output_dir, json_path, predictions, summary, table)


evaluate_model = run  # the recipe's former name
