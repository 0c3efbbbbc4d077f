"""Text-to-SQL: execution scoring on SQLite, exact-match normalisation, the sql task, the built-in set."""

from __future__ import annotations

import json
import math
from contextlib import closing

import pytest

from rayft.config.data import DatasetConfig
from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.data.builtin import load_builtin
from rayft.data.builtin.sql import SCHEMAS, iter_sql_examples
from rayft.errors import DataError
from rayft.evaluation import metrics, sql
from rayft.evaluation.report import comparison_examples, model_summary, pair_tests, render_html
from rayft.evaluation.runner import Examples, ModelRun, load_examples, score_run
from rayft.evaluation.summary import CompareSummary
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource

TABLE = json.dumps({
    "name": "players",
    "header": ["name", "team", "age", "points"],
    "types": ["text", "text", "integer", "real"],
    "rows": [["Ada", "Lions", 24, 12.5], ["Bruno", "Hawks", 31, 8.0], ["Chen", "Lions", 29, 20.25]],
})  # fmt: skip
REFERENCE = "SELECT name FROM players WHERE team = 'Lions'"


def _score(predicted: str, reference: str = REFERENCE) -> tuple[bool, sql.Outcome]:
    return sql.score_execution(predicted, reference, TABLE, "example 0")


@pytest.mark.parametrize(
    ("predicted", "correct"),
    [
        (REFERENCE, True),
        ("select NAME from players where team='Lions' and age > 0;", True),  # other text, same result
        ("SELECT name FROM players WHERE age < 30 AND points > 10", True),  # other query, same rows
        ("SELECT name FROM players WHERE team = 'Hawks'", False),  # runs, different result
        ("SELECT name, team FROM players WHERE team = 'Lions'", False),  # extra column
        ("SELECT name FROM players", False),
    ],
)
def test_execution_accuracy_compares_results_not_text(predicted: str, correct: bool) -> None:
    ok, outcome = _score(predicted)
    assert (ok, outcome.error) == (correct, None)


def test_numbers_compare_with_tolerance_and_order_matters_only_with_order_by() -> None:
    assert _score("SELECT AVG(points) * 1.0000000001 FROM players", "SELECT AVG(points) FROM players")[0]
    assert _score("SELECT COUNT(*) + 0.0 FROM players", "SELECT COUNT(name) FROM players")[0]  # 3.0 == 3
    ordered = "SELECT name FROM players ORDER BY age"
    assert not _score("SELECT name FROM players ORDER BY age DESC", ordered)[0]
    assert _score("SELECT name FROM players ORDER BY points DESC", "SELECT name FROM players")[0]


@pytest.mark.parametrize(
    ("predicted", "error"),
    [
        ("SELEC name FROM players", "syntax error"),
        ("SELECT height FROM players", "no such column"),
        ("SELECT name FROM players; DROP TABLE players", "one statement"),
        ("DELETE FROM players", "not authorized"),
        ("ATTACH DATABASE 'x.db' AS x", "not authorized"),
        ("", "empty query"),
    ],
)
def test_invalid_sql_is_an_outcome_not_an_exception(predicted: str, error: str) -> None:
    ok, outcome = _score(predicted)
    assert not ok and outcome.error is not None and error in outcome.error


def test_a_runaway_query_is_stopped_by_the_step_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql, "MAX_INSTRUCTIONS", 200_000)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    ok, outcome = _score(endless)
    assert not ok and outcome.error is not None and "time or step limit" in outcome.error


def test_a_reference_that_does_not_run_is_a_data_error() -> None:
    with pytest.raises(DataError, match=r"example 3: the reference query .* does not run"):
        sql.check_references(["SELECT nope FROM players"], [TABLE], ["example 3"])
    with pytest.raises(DataError, match="'types' must give one of"):
        sql.parse_table({"header": ["a"], "types": ["date"], "rows": []}, "row 7")


@pytest.mark.parametrize(
    ("output", "reference", "score"),
    [
        ('SELECT a FROM t WHERE b = "x y"', "select a from t where b='x y';", 1.0),  # quotes, case, semicolon
        ("SELECT  a\nFROM t", "SELECT a FROM t", 1.0),
        ("SELECT a FROM t WHERE b = 'X'", "SELECT a FROM t WHERE b = 'x'", 0.0),  # literals keep case
    ],
)
def test_exact_match_normalisation(output: str, reference: str, score: float) -> None:
    assert metrics.sql_exact_match(output, reference) == score


def test_sql_task_scores_every_metric_and_refuses_a_mix_of_tables() -> None:
    task = build_task(EvalConfig(task="sql"))
    outputs = [REFERENCE, "SELECT name FROM players WHERE age < 30 AND points > 10", "SELEC"]
    scored = task.score_all(outputs, [REFERENCE] * 3, [TABLE] * 3)
    assert [s.scores for s in scored] == [
        {"execution_accuracy": 1.0, "invalid_sql_rate": 0.0, "exact_match": 1.0},
        {"execution_accuracy": 1.0, "invalid_sql_rate": 0.0, "exact_match": 0.0},
        {"execution_accuracy": 0.0, "invalid_sql_rate": 1.0, "exact_match": 0.0},
    ]
    assert [s.scores for s in task.score_all(outputs[:1], [REFERENCE], [None])] == [{"exact_match": 1.0}]
    with pytest.raises(DataError, match="1 of 2 examples have no table"):
        task.score_all(outputs[:2], [REFERENCE] * 2, [TABLE, None])


def test_generator_is_deterministic_and_every_reference_returns_rows() -> None:
    rows = list(iter_sql_examples(300, seed=3))
    assert rows == list(iter_sql_examples(300, seed=3)) != list(iter_sql_examples(300, seed=4))
    assert {"COUNT(", "MIN(", "MAX(", "SUM(", "AVG(", " AND ", " > ", " < "} <= {
        token for r in rows for token in ("COUNT(", "MIN(", "MAX(", "SUM(", "AVG(", " AND ", " > ", " < ")
        if token in r["output"]
    }  # fmt: skip
    for row in rows:
        assert set(row) == {"instruction", "input", "output", "table"}
        with closing(sql.connect(sql.parse_table(row["table"]))) as conn:
            result = sql.reference_outcome(conn, row["output"], row["input"]).rows
        assert result and result[0][0] is not None, row


def test_generator_questions_name_what_their_query_selects() -> None:
    """The question alone determines the query: a count counts the key column (its question names no
    column), any other query selects the column whose words the question uses."""
    words = {c.name: c.words for schema in SCHEMAS for c in (schema.key, *schema.columns)}
    for row in iter_sql_examples(300, seed=5):
        target = row["output"].split(" FROM ")[0].removeprefix("SELECT ")
        column = target.split("(")[-1].rstrip(")")
        if target.startswith("COUNT("):
            assert column == json.loads(row["table"])["header"][0], row
        else:
            assert f" {words[column]} of " in row["input"], row


def test_builtin_splits_are_disjoint_and_eval_reads_their_tables() -> None:
    train = load_builtin("builtin:sql", "train", 200)
    test = load_builtin("builtin:sql", "test", 20)
    assert not {r["input"] for r in train} & {r["input"] for r in test}
    ev = EvalConfig(
        task="sql", question_field="input", answer_field="output", max_samples=20,
        datasets=[DatasetConfig(path="builtin:sql", split="test", max_rows=20)],
    )  # fmt: skip
    task = build_task(ev)
    examples = load_examples(ev, task)
    assert [e.table for e in examples.items] == [r["table"] for r in test]


def test_paired_comparison_of_execution_accuracy() -> None:
    ev = EvalConfig(task="sql", bootstrap_samples=200)
    task = build_task(ev)
    from rayft.evaluation.runner import Example

    examples = Examples([Example(f"t:{i}", "q", REFERENCE, "q", TABLE) for i in range(10)], [])
    source = ResolvedSource("m", "model", ModelConfig(name="org/m"))

    def run(label: str, right: int) -> ModelRun:
        gens = [Generation(REFERENCE if i < right else "SELECT 1") for i in range(10)]
        return score_run(label, source, examples, gens, task=task, ev=ev, elapsed_s=1.0)

    base, tuned = run("base", 1), run("tuned", 9)
    assert base.primary == "execution_accuracy"
    test = pair_tests([base, tuned], 0.95, 0.05, 200, 0)[0].tests["execution_accuracy"]
    assert test.test == "mcnemar" and test.difference == pytest.approx(0.8)
    assert test.p_value == pytest.approx(math.erfc(2)) and test.significant  # z = 8 / sqrt(8)
    summary = CompareSummary(
        task="sql", num_examples=10, num_fewshot=0, confidence=0.95, significance=0.05,
        primary_metric="execution_accuracy", models={r.label: model_summary(r) for r in (base, tuned)},
        pairs=pair_tests([base, tuned], 0.95, 0.05, 200, 0),
    )  # fmt: skip
    page = render_html(summary, comparison_examples([base, tuned], examples))
    assert all(name in page for name in ("execution_accuracy", "exact_match", "invalid_sql_rate"))
    assert "result: [(&#x27;Ada&#x27;,), (&#x27;Chen&#x27;,)]" in page  # the executed result beside the output


@pytest.mark.parametrize(
    ("predicted", "error"),
    [
        ("SELECT length(zeroblob(999999999))", "string or blob too big"),  # a 1 GB value, refused at once
        ("SELECT zeroblob(999999999), zeroblob(999999999), zeroblob(999999999), zeroblob(999999999)", "too big"),
        ("SELECT name FROM players WHERE " + " OR ".join(["age > 0"] * 2000), "over the limit of 10000"),
    ],
    ids=["one-GB-value", "four-GB-row", "long-completion"],
)
def test_a_query_is_bounded_in_memory_and_length(predicted: str, error: str) -> None:
    """A query's values, its result and its text are bounded: ``zeroblob(999999999)`` four times ran 27 s
    at 7.7 GB against a 2 s budget before SQLite's length limit and the sandboxed process."""
    ok, outcome = _score(predicted)
    assert not ok and outcome.error is not None and error in outcome.error, outcome


def test_a_query_sqlite_does_not_stop_is_killed_at_the_sandboxs_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's progress handler does not run inside one function call; the sandboxed process's wall-clock
    limit stops whatever SQLite's own checks miss (here they are switched off)."""
    monkeypatch.setattr(sql, "MAX_INSTRUCTIONS", 10**15)
    monkeypatch.setattr(sql, "TIMEOUT_S", 3600.0)
    monkeypatch.setattr(sql, "SANDBOX_WALL_S", 3.0)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    ok, outcome = _score(endless)
    assert not ok and outcome.error is not None and "timed out after 3 s" in outcome.error, outcome
    assert _score(REFERENCE)[0]  # the next query runs
