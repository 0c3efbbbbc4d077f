"""``rayft eval CONFIG [KEY=VALUE]... --model SRC``: score one model on the eval datasets.

Reads top to bottom: build the task, read the examples, resolve the model source (a run
directory picks its checkpoint), generate on Ray Data or in-process, score, and write
``eval.json`` (metrics with intervals, config, model fingerprint) and ``predictions.jsonl``.

Public entry point: :func:`run` (also ``rayft.evaluate``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.evaluation.report import console_table, model_summary, prediction_rows, write_jsonl
from rayft.evaluation.runner import Examples, ModelRun, choose_runtime, load_examples, run_model
from rayft.evaluation.sources import ResolvedSource, fingerprint_source, resolve_source
from rayft.evaluation.summary import EvalSummary, MetricSummary, ModelSummary
from rayft.evaluation.tasks import Task, build_task
from rayft.files import write_text_atomic
from rayft.generation.pool import Runtime

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
    task = build_task(cfg.eval)
    examples = load_examples(cfg.eval, task)
    resolved = resolve_source(source, cfg.model, cfg.eval.checkpoint)
    with generation_runtime(cfg) as runtime:
        model_run = evaluate_source(label, resolved, examples, task=task, cfg=cfg, runtime=runtime)
    summary = EvalSummary(
        task=task.name,
        num_examples=len(examples.items),
        num_fewshot=len(examples.fewshot),
        skipped_rows=examples.skipped,
        confidence=cfg.eval.confidence,
        model=model_summary(model_run),
        config={"eval": json.loads(cfg.eval.model_dump_json()), "model": json.loads(cfg.model.model_dump_json())},
    )
    output_dir = Path(output_dir)
    text = json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n"
    json_path = write_text_atomic(output_dir / EVAL_FILE, text)
    predictions = write_jsonl(output_dir / PREDICTIONS_FILE, prediction_rows(model_run, examples))
    table = console_table({label: summary.model}, cfg.eval.confidence)
    return EvalResult(output_dir, json_path, predictions, summary, table)


evaluate_model = run  # the recipe's former name


def evaluate_source(
    label: str, resolved: ResolvedSource, examples: Examples, *, task: Task, cfg: RayftConfig, runtime: Runtime
) -> ModelRun:
    """Generate, score and fingerprint one resolved model source."""
    run = run_model(label, resolved, examples, task=task, ev=cfg.eval, runtime=runtime)
    return dataclasses.replace(run, fingerprint=fingerprint_source(resolved))


@contextlib.contextmanager
def generation_runtime(cfg: RayftConfig) -> Iterator[Runtime]:
    """Decide where generation runs; for Ray, join or start it for the duration of the block."""
    import importlib.util

    ray_running = False
    if importlib.util.find_spec("ray") is not None:
        import ray

        ray_running = ray.is_initialized()
    runtime = choose_runtime(cfg.eval.runtime, ray_running, cfg.scaling.address)
    if runtime == "local":
        yield runtime
        return
    from rayft.runtime import ray_runtime

    with ray_runtime(cfg.scaling.address):
        yield runtime
