"""BLEU is reported as corpus BLEU, and compared with sacrebleu's paired approximate randomization test."""

from __future__ import annotations

import os

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from rayft.config.evaluation import EvalConfig
from rayft.config.model import ModelConfig
from rayft.evaluation.report import pair_tests
from rayft.evaluation.runner import Example, Examples, ModelRun, score_run
from rayft.evaluation.tasks import build_task
from rayft.generation.backend import Generation
from rayft.models.sources import ResolvedSource

REFS = [
    "the cat sat on the mat",
    "a quick brown fox jumps over the lazy dog",
    "rain is expected in the north tomorrow",
    "she sold the old car to her neighbour",
    "the meeting was moved to friday afternoon",
    "prices rose sharply in the last quarter",
] * 3
BASE = ["the cat", "a fox jumps", "rain tomorrow", "she sold a car", "meeting on friday", "prices rose"] * 3
TUNED = [
    "the cat sat on the mat",
    "a quick brown fox jumps over a lazy dog",
    "rain is expected in the north",
    "she sold the car to her neighbour",
    "the meeting was moved to friday",
    "prices rose sharply last quarter",
] * 3


def _run(label: str, outputs: list[str], ev: EvalConfig) -> ModelRun:
    examples = Examples([Example(f"ds:{i}", f"q{i}", ref, f"q{i}") for i, ref in enumerate(REFS)], [])
    source = ResolvedSource(label, "model", ModelConfig(name=f"org/{label}"))
    generations = [Generation(text, 5, 5) for text in outputs]
    return score_run(label, source, examples, generations, task=build_task(ev), ev=ev, elapsed_s=1.0)


def test_bleu_is_corpus_bleu_with_a_bootstrap_interval() -> None:
    ev = EvalConfig(task="bleu", bootstrap_samples=200)
    run = _run("base", BASE, ev)
    corpus = sacrebleu.corpus_bleu(BASE, [REFS]).score
    sentence_mean = sum(sacrebleu.sentence_bleu(o, [r]).score for o, r in zip(BASE, REFS, strict=True)) / len(REFS)
    estimate = run.metrics["bleu"]
    assert estimate.value == pytest.approx(corpus, rel=1e-9)
    assert abs(corpus - sentence_mean) > 1.0  # the two differ here: the test tells them apart
    assert estimate.method == "corpus_bootstrap"
    assert estimate.ci_low <= estimate.value <= estimate.ci_high
    assert run.scores[0]["bleu"] == pytest.approx(sacrebleu.sentence_bleu(BASE[0], [REFS[0]]).score)


def test_bleu_pairs_use_sacrebleus_paired_randomization_test() -> None:
    ev = EvalConfig(task="bleu", bootstrap_samples=300, seed=4)
    runs = [_run("base", BASE, ev), _run("tuned", TUNED, ev)]
    test = pair_tests(runs, 0.9, 0.05, 300, 4)[0].tests["bleu"]
    os.environ["SACREBLEU_SEED"] = "5"  # sacrebleu's seed is rayft's seed + 1 (sacrebleu reads 0 as unseeded)
    try:
        _, results = PairedTest([("base", BASE), ("tuned", TUNED)], {"BLEU": BLEU()}, [REFS], "ar", 300)()
    finally:
        del os.environ["SACREBLEU_SEED"]
    expected = results["BLEU"][1]
    assert test.test == "sacrebleu_paired_ar"
    assert test.p_value == pytest.approx(expected.p_value)
    assert test.significant is (expected.p_value < 0.05)
    corpus_diff = sacrebleu.corpus_bleu(TUNED, [REFS]).score - sacrebleu.corpus_bleu(BASE, [REFS]).score
    assert test.difference == pytest.approx(corpus_diff, rel=1e-9)
    assert test.diff_ci_low <= test.difference <= test.diff_ci_high
    assert test.confidence == 0.9
