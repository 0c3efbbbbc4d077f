"""``rayft compare CONFIG --model base=SRC --model tuned=SRC``: models side by side on the same prompts.

Public entry point: :func:`run` (also ``rayft.api.compare``).

Reads top to bottom: resolve every source first (so a bad one fails before any generation),
check the examples in one streamed pass, evaluate each model on them a window at a time
(:mod:`rayft.evaluation.streaming`), run a paired test of every metric for every pair (McNemar for
correct/incorrect, paired bootstrap for continuous metrics) with a TOST equivalence test at
``eval.equivalence_margin`` and the flips of correct/incorrect metrics, and write ``compare.json``,
``compare.md``, a self-contained ``compare.html`` and ``examples.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.environments.evaluate import check_without_tools, stream_eval
from rayft.errors import ConfigError
from rayft.evaluation.gates import check_gates, check_labels, gate_margins, parse_gates
from rayft.evaluation.report import console_table, model_summary, pair_tests, render_html, render_markdown
from rayft.evaluation.runner import eval_source, generation_runtime, open_examples
from rayft.evaluation.streaming import read_records, scratch_files, write_comparison
from rayft.evaluation.summary import CompareSummary
from rayft.evaluation.tasks import build_task
from rayft.files import check_writable_dir, write_text_atomic

JSON_FILE = "compare.json"
MARKDOWN_FILE = "compare.md"
HTML_FILE = "compare.html"
EXAMPLES_FILE = "examples.jsonl"


@dataclass(frozen=True)
class CompareResult:
    """The comparison's files, its summary (metrics with intervals, paired tests), and examples.

    ``summary`` is what ``compare.json`` holds; ``shown`` the examples where the models disagree
    most (what the Markdown and HTML pages show).
    """

    output_dir: Path
    json_path: Path
    markdown_path: Path
    html_path: Path
    examples_path: Path
    summary: CompareSummary
    shown: list[dict[str, Any]]
    table: str

    @property
    def examples(self) -> list[dict[str, Any]]:
        """Every row of ``examples.jsonl`` (read from the file: the comparison does not hold them)."""
        return list(read_records(self.examples_path))


def run(cfg: RayftConfig, sources: Mapping[str, str], output_dir: Path, *, gates: Sequence[str] = ()) -> CompareResult:
    """Evaluate every labelled source (label -> model source) on the same examples; compare them pairwise.

    ``gates`` (:mod:`rayft.evaluation.gates`) are parsed and their labels checked before any model
    loads; each gets a TOST at its margin, and their results go into ``compare.json`` (the caller
    decides what a failed gate stops).
    """
    if len(sources) < 2:
        raise ConfigError(
            f"compare needs at least two models, got {len(sources)} ({', '.join(sources) or 'none'}); "
            "pass --model base=SRC --model tuned=SRC"
        )
    parsed = parse_gates(gates)
    check_labels(parsed, sources)
    check_without_tools(cfg.eval, list(sources))
    check_writable_dir(Path(output_dir), where="--output")  # before any model loads
    task = build_task(cfg.eval)
    resolved = {label: eval_source(src, cfg) for label, src in sources.items()}
    examples = open_examples(cfg.eval, task)
    out = Path(output_dir)
    with scratch_files(out / EXAMPLES_FILE, len(resolved)) as paths, generation_runtime(cfg) as runtime:
        runs = [
            stream_eval(label, r, examples, path, task=task, cfg=cfg, runtime=runtime)
            for (label, r), path in zip(resolved.items(), paths, strict=True)
        ]
        shown = write_comparison(out / EXAMPLES_FILE, runs, runs[0].primary)
    ev = cfg.eval
    summary = CompareSummary(
        task=task.name,
        num_examples=examples.count,
        num_fewshot=len(examples.fewshot),
        skipped_rows=examples.skipped,
        confidence=ev.confidence,
        significance=ev.significance,
        primary_metric=runs[0].primary,
        models={r.label: model_summary(r) for r in runs},
        pairs=pair_tests(
            runs,
            ev.confidence,
            ev.significance,
            ev.bootstrap_samples,
            ev.seed,
            margins=gate_margins(parsed, ev.equivalence_margin),
        ),
        config={"eval": json.loads(ev.model_dump_json())},
    )
    summary = dataclasses.replace(summary, gates=check_gates(parsed, summary, ev.equivalence_margin))
    return CompareResult(
        output_dir=out,
        json_path=write_text_atomic(
            out / JSON_FILE, json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n"
        ),
        markdown_path=write_text_atomic(out / MARKDOWN_FILE, render_markdown(summary, shown)),
        html_path=write_text_atomic(out / HTML_FILE, render_html(summary, shown)),
        examples_path=out / EXAMPLES_FILE,
        summary=summary,
        shown=shown,
        table=console_table(summary.models, ev.confidence),
    )


compare_models = run  # the recipe's former name
