"""Per-example text metrics: exact match, ROUGE-L, BLEU, normalised SQL, BERTScore, user metrics.

Each metric scores one (output, reference) pair; aggregates and intervals come from
:mod:`rayft.evaluation.stats`. ROUGE-L uses Google's ``rouge-score`` and BLEU ``sacrebleu``
(0-100): each example gets its sentence BLEU, but the reported BLEU is corpus BLEU, computed from
the summed per-example statistics, and two models' BLEU are compared with sacrebleu's paired
approximate randomization test (see :class:`CorpusMetric`). BERTScore is an optional extra.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
    no spaces around punctuation and operators, no trailing semicolon, literals in single quotes."""
    parts = _SQL_QUOTED.split(sql.strip().rstrip(";").strip())
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a quoted literal: keep its case and spacing; "x" and 'x' read the same
            out.append("'" + part[1:-1].replace("'", "''") + "'" if part.startswith('"') else part)
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


def bleu_statistics(output: str, reference: str) -> list[float]:
    """The sufficient statistics of BLEU for one example: output and reference lengths, then the
    matched and total n-gram counts for n = 1..4 (summed over examples, they give corpus BLEU)."""
    import sacrebleu

    s = sacrebleu.sentence_bleu(output, [reference])
    return [float(s.sys_len), float(s.ref_len), *map(float, s.counts), *map(float, s.totals)]


def bleu_from_statistics(sums: Sequence[float]) -> float:
    """Corpus BLEU (sacrebleu's defaults: exp smoothing, 4-grams) from summed :func:`bleu_statistics`."""
    from sacrebleu.metrics.bleu import BLEU

    counts, totals = [round(x) for x in sums[2:6]], [round(x) for x in sums[6:10]]
    return float(BLEU.compute_bleu(counts, totals, round(sums[0]), round(sums[1]), smooth_method="exp").score)


@contextlib.contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacrebleu's significance tests read their seed from SACREBLEU_SEED; set it for one call."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = before


def bleu_paired_p_value(
    outputs_a: Sequence[str], outputs_b: Sequence[str], references: Sequence[str], samples: int, seed: int
) -> float:
    """p-value of sacrebleu's paired approximate randomization test of corpus BLEU, B against A.

    sacrebleu treats a seed of 0 as "unseeded", so it is given ``seed + 1``.
    """
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.significance import PairedTest, Result

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # it logs each step at INFO
    with _sacrebleu_seed(seed + 1):
        test = PairedTest([("a", list(outputs_a)), ("b", list(outputs_b))], {"BLEU": BLEU()}, [list(references)],
                          test_type="ar", n_samples=samples)  # fmt: skip
        _, results = test()
    result = results["BLEU"][1]  # [baseline, system]
    assert isinstance(result, Result) and result.p_value is not None  # a paired test always sets it
    return float(result.p_value)


@dataclass(frozen=True)
class CorpusMetric:
    """A metric of the whole corpus (not a mean of per-example scores), e.g. corpus BLEU.

    ``statistics`` gives one example's sufficient statistics, ``from_statistics`` the metric of
    their sum, and ``paired_p_value(outputs_a, outputs_b, references, samples, seed)`` the
    p-value of the field's paired test, named ``test``.
    """

    statistics: Callable[[str, str], list[float]]
    from_statistics: Callable[[Sequence[float]], float]
    paired_p_value: Callable[[Sequence[str], Sequence[str], Sequence[str], int, int], float]
    test: str


CORPUS_BLEU = CorpusMetric(bleu_statistics, bleu_from_statistics, bleu_paired_p_value, "sacrebleu_paired_ar")


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


def load_custom_metric(path: str, field: str = "eval.metric") -> CustomMetric:
    """Import the function ``package.module:function`` named by ``field`` (``eval.metric``, or a reward
    function of ``train.rl.rewards``)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{field}: cannot import module {module_name!r} ({exc}); make it importable (installed, or on "
            "PYTHONPATH) or fix the path 'package.module:function'"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{field}: {module_name!r} has no function {attr!r}; check the name after ':'")
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
