"""Streamed evaluation: lazy examples, windowed scoring and the reports joined from scratch files
agree with the same evaluation held in memory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rayft.config.data import DatasetConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.evaluation.report import (
    comparison_examples,
    disagreements,
    example_record,
    pair_tests,
    prediction_rows,
)
from rayft.evaluation.runner import Examples, ModelRun, ScoreTally, load_examples, open_examples, score_run
from rayft.evaluation.streaming import read_records, scratch_files, write_comparison, write_predictions
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource


def _dataset(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "eval.jsonl"
    lines = [json.dumps({"question": f"q{i} " + "x" * (i % 7), "answer": f"#### {i % 5}"}) for i in range(n)]
    lines.insert(3, "{not json")
    lines.insert(8, json.dumps({"question": ["a", "list"], "answer": "#### 1"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _ev(path: Path, **update: object) -> EvalConfig:
    settings: dict[str, object] = {"task": "rouge", "bootstrap_samples": 100, **update}
    return EvalConfig(datasets=[DatasetConfig(path=str(path))], **settings)  # type: ignore[arg-type]


def test_the_stream_reads_the_examples_load_examples_holds(tmp_path: Path) -> None:
    ev = _ev(_dataset(tmp_path, 40), num_fewshot=2, max_samples=30)
    task = build_task(ev)
    stream = open_examples(ev, task)
    held = load_examples(ev, task)
    assert stream.count == len(held.items) == 30
    assert list(stream) == list(stream) == held.items  # read again, lazily, each time
    assert stream.fewshot == held.fewshot == [("q0 ", "#### 0"), ("q1 x", "#### 1")]
    assert [s["id"] for s in stream.skipped] == ["eval.jsonl:3", "eval.jsonl:8"]
    assert stream.skipped[0]["reason"].startswith("bad_json (")
    assert "line 4" in stream.skipped[0]["reason"]  # the file's own line number
    assert stream.skipped[1]["reason"] == "empty or non-text question"
    assert [e.id for e in held.items[:3]] == ["eval.jsonl:2", "eval.jsonl:4", "eval.jsonl:5"]  # 0, 1: few-shot


def test_a_missing_column_is_refused_before_any_generation(tmp_path: Path) -> None:
    from rayft.errors import DataError

    ev = _ev(_dataset(tmp_path, 5), question_field="prompt")
    with pytest.raises(DataError, match=r"has no column 'prompt' \(columns: question, answer\)"):
        open_examples(ev, build_task(ev))


def _source(label: str) -> ResolvedSource:
    return ResolvedSource(label, "model", ModelConfig(name=f"org/{label}"))


def _outputs(examples: Examples, shift: int) -> list[Generation]:
    return [Generation(f"#### {(i * shift) % 5}", 3, i % 4) for i, _ in enumerate(examples.items)]


def _streamed(label: str, examples: Examples, gens: list[Generation], ev: EvalConfig, path: Path) -> ModelRun:
    """A run scored the way a streamed run is: windows of 7 examples, rows appended to ``path``."""
    tally = ScoreTally(build_task(ev))
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, len(examples.items), 7):
            items, window = examples.items[start : start + 7], gens[start : start + 7]
            for item in zip(items, window, tally.add(items, window), strict=True):
                out.write(json.dumps(example_record(*item)) + "\n")
    return dataclasses.replace(tally.finish(label, _source(label), ev, 1.0), rows_path=path)


@pytest.mark.parametrize("task", ["rouge", "gsm8k", "bleu"])
def test_windowed_scoring_and_joined_reports_equal_the_held_ones(tmp_path: Path, task: str) -> None:
    ev = _ev(_dataset(tmp_path, 130), task=task)
    examples = load_examples(ev, build_task(ev))
    outputs = {"base": _outputs(examples, 1), "tuned": _outputs(examples, 3)}
    held = [
        score_run(k, _source(k), examples, g, task=build_task(ev), ev=ev, elapsed_s=1.0) for k, g in outputs.items()
    ]
    with scratch_files(tmp_path / "examples.jsonl", 2) as paths:
        streamed = [_streamed(k, examples, g, ev, p) for (k, g), p in zip(outputs.items(), paths, strict=True)]
        assert streamed[0].metrics == held[0].metrics
        assert streamed[1].kinds == held[1].kinds
        assert streamed[1].generated_tokens == held[1].generated_tokens
        assert pair_tests(streamed, 0.95, 0.05, 100, 0) == pair_tests(held, 0.95, 0.05, 100, 0)
        predictions = write_predictions(tmp_path / "predictions.jsonl", streamed[0])
        assert list(read_records(predictions)) == json.loads(json.dumps(prediction_rows(held[0], examples)))
        shown = write_comparison(tmp_path / "examples.jsonl", streamed, streamed[0].primary)
        rows = json.loads(json.dumps(comparison_examples(held, examples)))
        assert list(read_records(tmp_path / "examples.jsonl")) == rows
        assert shown == disagreements(rows, held[0].primary)
        assert len(shown) == 50  # of more: the ones kept while streaming are the ones a sort picks
    assert not list(tmp_path.glob(".examples.jsonl.rows*"))  # scratch files removed


def test_a_metric_first_scored_late_counts_zero_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    metric = tmp_path / "streamed_late_metric.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    metric.write_text(
        "def score(output, reference):\n"
        "    return {'m': 1.0} | ({'late': 1.0} if output == 'yes' else {})\n"
    )  # fmt: skip
    ev = _ev(_dataset(tmp_path, 20), task="custom", metric="streamed_late_metric:score")
    examples = load_examples(ev, build_task(ev))
    gens = [Generation("yes" if i >= 10 else "no") for i in range(len(examples.items))]
    held = score_run("m", _source("m"), examples, gens, task=build_task(ev), ev=ev, elapsed_s=1.0)
    streamed = _streamed("m", examples, gens, ev, tmp_path / "rows.jsonl")
    assert streamed.values["late"].tolist() == [0.0] * 10 + [1.0] * (len(gens) - 10)
    assert streamed.metrics == held.metrics
    assert list(streamed.kinds) == ["m", "late"]


def test_sql_examples_without_a_table_are_refused_across_windows(tmp_path: Path) -> None:
    from rayft.data.builtin import load_builtin
    from rayft.errors import DataError

    rows = load_builtin("builtin:sql", "test", 12)
    rows[-1] = {**rows[-1], "table": None}  # only the last: in another window than the first
    path = tmp_path / "sql.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = EvalConfig(task="sql", question_field="input", answer_field="output", datasets=[DatasetConfig(path=str(path))])
    with pytest.raises(DataError, match=r"1 of 12 examples have no table \(first: example 11\)"):
        open_examples(ev, build_task(ev))
