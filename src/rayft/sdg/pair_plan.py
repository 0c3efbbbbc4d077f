"""The plan of a pair-making run, decided before anything runs: the sampler (the resolved model with
the configured sampling and a seed), and each problem's prompt and reference, or the reason it is left
out before sampling. Pure functions of the config, unit-tested without Ray. The answer checker is the
caller's (:class:`rayft.sdg.pairs.AnswerChecker`): evaluation's GSM8K checker, which a recipe hands in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.config import RayftConfig
from rayft.config.generation import GenerationConfig
from rayft.config.pairs import PairsConfig
from rayft.generation.backend import Prompt
from rayft.models.sources import ResolvedSource
from rayft.runs.location import local_run_dir
from rayft.sdg.dedup import NgramIndex
from rayft.sdg.pairs import AnswerChecker, Problem
from rayft.sdg.rows import seed_id


@dataclass(frozen=True)
class PairsPlan:
    """The pairs section as it runs: the sampler's config (model resolved, seeded), the seed of the
    choice of pairs, and what was resolved for the model (for the summary)."""

    pairs: PairsConfig
    sampler: GenerationConfig
    rng_seed: int
    model: str


def plan_pairs(pairs: PairsConfig, resolved: ResolvedSource, default_seed: int) -> PairsPlan:
    """The plan for ``pairs`` sampling from ``resolved`` (``default_seed`` when ``pairs.seed`` is unset)."""
    rng_seed = pairs.seed if pairs.seed is not None else default_seed
    seed = pairs.generation.seed if pairs.generation.seed is not None else rng_seed
    sampler = pairs.generation.model_copy(
        update={"model": resolved.model, "adapter_path": resolved.adapter_path, "seed": seed}
    )
    return PairsPlan(pairs, sampler, rng_seed, resolved.describe())


def resolve_pairs_dir(cfg: RayftConfig, output_dir: Path | None) -> Path:
    """The explicit directory, else ``pairs.output_dir``, else ``<storage_path>/<name>/pairs``."""
    if output_dir is not None:
        return Path(output_dir)
    if cfg.pairs.output_dir:
        return Path(cfg.pairs.output_dir)
    fix = "set pairs.output_dir=/a/local/dir"
    return local_run_dir(cfg.storage_path, cfg.name, command="rayft pairs", fix=fix) / "pairs"


def problem_prompt(question: str, pairs: PairsConfig) -> tuple[str, Prompt]:
    """The prompt text a pair keeps, and the prompt the sampler is sent (a chat when use_chat_template)."""
    text = pairs.prompt_template.replace("{question}", question)
    if not pairs.use_chat_template:
        return text, text
    system = [{"role": "system", "content": pairs.system_prompt}] if pairs.system_prompt else []
    return text, [*system, {"role": "user", "content": text}]


def screen_problem(question: str, answer: str, checker: AnswerChecker, leaks: NgramIndex) -> tuple[str, str] | None:
    """Why a problem is left out before sampling (reason, detail), or None when it is sampled."""
    if checker.reference(answer) is None:
        return "bad_reference", f"the reference has no final answer to check: {answer[-80:]!r}"
    leak = leaks.overlap(question)
    if leak is not None:
        return "eval_overlap", f"shares the n-gram {leak!r} with an evaluation problem"
    return None


def problem_of(row: dict[str, Any]) -> Problem:
    """The :class:`~rayft.sdg.pairs.Problem` of a sampled problem row (see :func:`problem_row`)."""
    return Problem(row["problem_id"], row["prompt_text"], row["reference"])


def problem_row(question: str, reference: str, answer: str, pairs: PairsConfig) -> dict[str, Any]:
    """One problem as a row to sample: its content id, question, reference answer and prompts."""
    text, prompt = problem_prompt(question, pairs)
    return {"problem_id": seed_id(question, answer), "question": question,
            "reference": reference, "prompt_text": text, "prompt": prompt}  # fmt: skip


def sample_rows(problem: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """A problem's row repeated once per sample, each saying how many samples its problem has."""
    return [{**problem, "sample": index, "samples": k} for index in range(k)]


def sample_blocks(problems: list[dict[str, Any]], k: int, batch_size: int) -> list[list[dict[str, Any]]]:
    """The problems' sample rows (k each, in order) cut into blocks of one generate batch each.

    Ray Data returns a block's rows when every batch of it is generated, by the one actor that took
    it: a block of one batch comes back as soon as that batch is done, so finished problems are
    written as the batches come, and the actors share the work batch by batch. A problem's samples
    may straddle two blocks; they are regrouped by problem as they come back.
    """
    rows = [row for problem in problems for row in sample_rows(problem, k)]
    return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
