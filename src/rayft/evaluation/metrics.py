"""Per-example text metrics: exact match, ROUGE-L, BLEU, normalised SQL, BERTScore, user metrics.

Each metric scores one (output, reference) pair; aggregates and intervals come from
:mod:`rayft.evaluation.stats`. ROUGE-L uses Google's ``rouge-score`` and BLEU ``sacrebleu``
(sentence BLEU with exponential smoothing, on its 0-100 scale); BERTScore is an optional extra.
"""

from __future__ import annotations

import importlib
import re
import string
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from rayft.errors import ConfigError, MissingDependencyError

_WS = re.compile(r"\s+")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and collapse whitespace (SQuAD-style answer normalisation)."""
    return _WS.sub(" ", text.lower().translate(_PUNCT)).strip()


def exact_match(output: str, reference: str) -> float:
    """1.0 when the normalised output equals the normalised reference."""
    return float(normalize_text(output) == normalize_text(reference))


_SQL_SPACE_AROUND = re.compile(r"\s*([(),=<>!]+)\s*")
_SQL_QUOTED = re.compile(r"('(?:[^']|'')*'|\"[^\"]*\")")


def normalize_sql(sql: str) -> str:
    """Canonical text of a SQL query: case-folded outside quoted literals, whitespace collapsed,
    no spaces around punctuation and operators, no trailing semicolon."""
    parts = _SQL_QUOTED.split(sql.strip().rstrip(";").strip())
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a quoted literal: keep its case and spacing
            out.append(part)
        else:
            out.append(_SQL_SPACE_AROUND.sub(r"\1", _WS.sub(" ", part.lower())))
    return "".join(out).strip()


def sql_exact_match(output: str, reference: str) -> float:
    """1.0 when both queries have the same canonical text (see :func:`normalize_sql`)."""
    return float(normalize_sql(output) == normalize_sql(reference))


@cache
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(output: str, reference: str) -> float:
    """ROUGE-L F1 (longest common subsequence of stemmed tokens), in [0, 1]."""
    return float(_rouge_scorer().score(reference, output)["rougeL"].fmeasure)


def bleu(output: str, reference: str) -> float:
    """Sentence BLEU of the output against one reference, 0-100 (sacrebleu, exp smoothing)."""
    import sacrebleu

    return float(sacrebleu.sentence_bleu(output, [reference]).score)


def bertscore_f1(outputs: Sequence[str], references: Sequence[str], model: str, device: str = "cpu") -> list[float]:
    """BERTScore F1 of every pair with the scoring ``model`` (needs ``rayft[bertscore]``)."""
    try:
        from bert_score import score
    except ImportError:
        raise MissingDependencyError("bert-score", "bertscore", "eval.task=bertscore") from None
    try:
        _, _, f1 = score(list(outputs), list(references), model_type=model, device=device, verbose=False)
    except KeyError:
        raise ConfigError(
            f"eval.bertscore_model: bert-score knows no default layer for {model!r}; use a model it knows "
            "(e.g. roberta-large, microsoft/deberta-xlarge-mnli)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"eval.bertscore_model: cannot load the scoring model {model!r} ({exc}); give a local directory "
            "or a Hub id this machine can download (e.g. roberta-large)"
        ) from exc
    return [float(x) for x in f1.tolist()]


CustomMetric = Callable[[str, str], Any]


def load_custom_metric(path: str) -> CustomMetric:
    """Import the function ``package.module:function`` named by ``eval.metric``."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"eval.metric: cannot import module {module_name!r} ({exc}); make it importable (installed, or on "
            "PYTHONPATH) or fix the path 'package.module:function'"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"eval.metric: {module_name!r} has no function {attr!r}; check the name after ':'")
    return fn  # type: ignore[no-any-return]


def custom_scores(fn: CustomMetric, output: str, reference: str, where: str) -> dict[str, float]:
    """Call a user metric and turn its result (bool, number, or dict of numbers) into named scores."""
    value = fn(output, reference)
    items: list[tuple[Any, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, bool | int | float):
        items = [("score", value)]
    else:
        raise ConfigError(
            f"eval.metric returned {type(value).__name__} for {where}; it must return a bool, a number, "
            "or a dict of metric name -> number"
        )
    scores = {}
    for name, number in items:
        if not isinstance(number, bool | int | float):
            raise ConfigError(f"eval.metric returned {name}={number!r} for {where}; values must be numbers")
        scores[str(name)] = float(number)
    return scores
