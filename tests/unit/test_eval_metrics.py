"""Text metrics, user metrics by import path, task table, and the eval config's checks."""

from __future__ import annotations

import pytest

from rayft.config import load_config
from rayft.config.evaluation import EvalConfig
from rayft.errors import ConfigError, MissingDependencyError
from rayft.evaluation import metrics
from rayft.evaluation.tasks import build_prompt, build_task


def test_exact_match_normalises_case_punctuation_and_spaces() -> None:
    assert metrics.exact_match("  The Eiffel   tower! ", "the eiffel tower") == 1.0
    assert metrics.exact_match("Eiffel", "the eiffel tower") == 0.0


@pytest.mark.parametrize(
    ("output", "reference", "score"),
    [
        ("select  Notes FROM table\nWHERE x = 3;", "SELECT notes FROM table WHERE x=3", 1.0),
        ("SELECT a FROM t WHERE name = 'Bob'", "select a from t where name='Bob'", 1.0),
        ("SELECT a FROM t WHERE name = 'bob'", "SELECT a FROM t WHERE name = 'Bob'", 0.0),  # literals keep case
        ("SELECT COUNT(a) FROM t", "SELECT count ( a ) FROM t", 1.0),
        ("SELECT b FROM t", "SELECT a FROM t", 0.0),
    ],
)
def test_sql_exact_match(output: str, reference: str, score: float) -> None:
    assert metrics.sql_exact_match(output, reference) == score


def test_rouge_l_and_bleu_known_values() -> None:
    assert metrics.rouge_l("the cat sat", "the cat sat") == pytest.approx(1.0)
    # LCS 3 of 3 output tokens and 4 reference tokens: P=1, R=0.75, F=6/7.
    assert metrics.rouge_l("the cat sat", "the cat sat on") == pytest.approx(6 / 7)
    assert metrics.rouge_l("dogs bark", "the cat sat") == 0.0
    assert metrics.bleu("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(100.0)
    assert 0.0 < metrics.bleu("the cat sat on a mat", "the cat sat on the mat") < 100.0


def length_ratio(output: str, reference: str) -> dict[str, float]:
    """A custom metric returning two named scores."""
    return {"length_ratio": len(output) / max(len(reference), 1), "nonempty": float(bool(output))}


def test_custom_metric_by_import_path() -> None:
    task = build_task(EvalConfig(task="custom", metric="tests.unit.test_eval_metrics:length_ratio"))
    scored = task.score(["abcd", ""], ["ab", "ab"])
    assert [s.scores for s in scored] == [
        {"length_ratio": 2.0, "nonempty": 1.0},
        {"length_ratio": 0.0, "nonempty": 0.0},
    ]
    assert task.kind("nonempty", [1.0, 0.0]) == "binary"
    assert task.kind("length_ratio", [2.0, 0.0]) == "continuous"
    assert task.primary_of(["length_ratio", "nonempty"]) == "length_ratio"
    boolean = build_task(EvalConfig(task="custom", metric="operator:eq"))
    assert [s.scores for s in boolean.score(["a", "b"], ["a", "a"])] == [{"score": 1.0}, {"score": 0.0}]


def test_custom_metric_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        build_task(EvalConfig(task="custom", metric="no_such_module_xyz:f"))
    with pytest.raises(ConfigError, match="'operator' has no function 'nope'"):
        build_task(EvalConfig(task="custom", metric="operator:nope"))
    task = build_task(EvalConfig(task="custom", metric="operator:concat"))
    with pytest.raises(ConfigError, match="returned str for example 0"):
        task.score(["a"], ["b"])


def test_bertscore_without_the_extra_says_how_to_install_it() -> None:
    pytest.importorskip("torch")
    try:
        import bert_score  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("bert-score is installed here")
    task = build_task(EvalConfig(task="bertscore"))
    with pytest.raises(MissingDependencyError, match=r"pip install 'rayft\[bertscore\]'"):
        task.score(["a"], ["b"])


def test_gsm8k_uses_a_prompt_template_when_given() -> None:
    task = build_task(EvalConfig(task="gsm8k"))
    assert build_prompt(task, "2+2?", [], chat=True, template="{question}") == [{"role": "user", "content": "2+2?"}]


def test_prompt_template_and_chat_for_generic_tasks() -> None:
    task = build_task(EvalConfig(task="sql"))
    prompt = build_prompt(task, "list names", [("q1", "SELECT 1")], chat=False, template="Translate: {question}")
    assert prompt == "Translate: q1\nSELECT 1\n\nTranslate: list names"
    chat = build_prompt(task, "list names", [], chat=True, system_prompt="SQL only")
    assert chat == [{"role": "system", "content": "SQL only"}, {"role": "user", "content": "list names"}]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.task=custom", "task 'custom' needs eval.metric"),
        ("eval.checkpoint=newest", "must be latest, best, final, or step-N"),
        ("eval.prompt_template=Question {q}", "cannot be filled .*KeyError"),
        ("eval.generation.batch_size=4", "eval.generation.batch_size: set eval.batch_size"),
        ("eval.generation.model.name=x", "the model comes from the source being evaluated"),
    ],
)
def test_eval_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_dumped_config_with_eval_and_export_reloads() -> None:
    import yaml

    from rayft.config import dump_config
    from rayft.config.loader import validate_config

    cfg = load_config(None, ["eval.max_samples=5", "eval.generation.max_new_tokens=32", "export.merge=false"])
    again = validate_config(yaml.safe_load(dump_config(cfg)))
    assert again == cfg
