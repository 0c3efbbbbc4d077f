"""``rayft pairs CONFIG [--model SOURCE]``: preference pairs from a model's verified answers.

Reads top to bottom: settle the output directory and hold its lock, resolve the model source (a run,
final/, a model directory, a Hub id), plan the sampler, read the evaluation problems to keep out, then
sample k answers per problem on Ray Data, check each with evaluation's GSM8K checker and write the pairs
(:mod:`rayft.sdg.pair_maker`).
"""

from __future__ import annotations

from pathlib import Path

from rayft.config import RayftConfig
from rayft.evaluation import gsm8k
from rayft.models.sources import ResolvedSource, resolve_source
from rayft.runs.lock import run_lock
from rayft.runtime import ray_runtime
from rayft.sdg.pair_maker import PairsResult, make_pairs_on_ray
from rayft.sdg.pair_plan import plan_pairs, resolve_pairs_dir
from rayft.sdg.seeds import read_eval_questions

EXTRACTORS = {"strict": gsm8k.extract_strict, "flexible": gsm8k.extract_flexible}
"""How an answer's final number is read, by ``pairs.answer_match``."""


class Gsm8kChecker:
    """Evaluation's GSM8K checker as the pair maker's verdict (:class:`rayft.sdg.pairs.AnswerChecker`):
    a sample is correct when the number read from it (strict ``#### N`` or the last number) equals the
    reference solution's ``#### N``, as the gsm8k eval task scores it."""

    def __init__(self, answer_match: str) -> None:
        self.extract = EXTRACTORS[answer_match]

    def reference(self, solution: str) -> str | None:
        """The reference's final answer, or None without a ``#### N`` line."""
        return gsm8k.reference_answer(solution) if gsm8k.STRICT.search(solution) else None

    def parses(self, sample: str) -> bool:
        """Whether a number can be read from ``sample``."""
        return self.extract(sample) != gsm8k.INVALID

    def is_correct(self, sample: str, reference: str) -> bool:
        """Whether ``sample``'s number is ``reference``."""
        return gsm8k.is_correct(self.extract(sample), reference)


def run(
    cfg: RayftConfig, *, model: str | None = None, output_dir: Path | None = None, address: str | None = None
) -> PairsResult:
    """Make pairs from ``cfg.pairs`` with ``model`` (else ``pairs.model``, else ``model.name``)."""
    out = resolve_pairs_dir(cfg, output_dir)
    resolved = sampler_source(cfg, model or cfg.pairs.model or cfg.model.name)  # a bad source fails before Ray starts
    with run_lock(out, command="rayft pairs"), ray_runtime(address or cfg.scaling.address):
        return make(cfg, resolved, out)


def sampler_source(cfg: RayftConfig, source: str) -> ResolvedSource:
    """What the sampler loads for ``source``; with the 'openai' backend, the name the endpoint serves."""
    if cfg.pairs.generation.backend == "openai":
        return ResolvedSource(source, "model", cfg.model.model_copy(update={"name": source, "gguf_file": None}))
    return resolve_source(source, cfg.model, cfg.eval.checkpoint)


def make(cfg: RayftConfig, resolved: ResolvedSource, out: Path) -> PairsResult:
    """The work of :func:`run` into ``out``, with Ray running (the pipeline's pairs stage calls it)."""
    plan = plan_pairs(cfg.pairs, resolved, cfg.seed)
    eval_questions = read_eval_questions(cfg.pairs.decontamination)
    return make_pairs_on_ray(plan, Gsm8kChecker(cfg.pairs.answer_match), eval_questions, out)
