"""Quality checks that ask the teacher: self-consistency (solve the new problem k more times and
agree with its answer) and an LLM judge (a 1-10 score), as a stateful Ray Data actor stage.

Both go through the same generation backend protocol as the generator, so they work with the
hf, vllm and openai backends. A failed check generation rejects the row with the reason and the
backend's error; rows already rejected by earlier stages are passed through untouched.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rayft.config.generation import GenerationConfig
from rayft.generation.backend import Generation, Prompt
from rayft.generation.factory import build_backend, sampling_params
from rayft.sdg.mathcheck import AnswerError, final_answer
from rayft.sdg.rows import reject
from rayft.sdg.stages import TIME_PREFIX, Row

if TYPE_CHECKING:
    import ray.data

STAGE = "teacher_checks"
_SCORE = re.compile(r"score\s*[:=]?\s*(\d+(?:\.\d+)?)", re.I)
_LAST_FINAL = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


@dataclass(frozen=True)
class TeacherChecks:
    """What to ask the teacher about each row."""

    samples: int
    min_agree: float
    judge: bool
    min_score: int
    solve_prompt: str
    judge_prompt: str
    system: str | None


def sampled_final(text: str) -> str | None:
    """The last '#### N' number of a solution, normalised ('1,200' -> '1200', '5.0' -> '5'), or None."""
    found = _LAST_FINAL.findall(text)
    if not found:
        return None
    value = str(found[-1]).replace(",", "")
    return value.rstrip("0").rstrip(".") if "." in value else value


def judge_score(text: str) -> float | None:
    """The score of a judge reply ('Score: 8'), or None."""
    match = _SCORE.search(text)
    return float(match.group(1)) if match else None


def check_prompts(row: Row, checks: TeacherChecks) -> list[Prompt]:
    """The prompts one row needs: k solve prompts, then the judge prompt."""
    system = [{"role": "system", "content": checks.system}] if checks.system else []
    solve = checks.solve_prompt.replace("{question}", row["question"])
    prompts: list[Prompt] = [[*system, {"role": "user", "content": solve}]] * checks.samples
    if checks.judge:
        text = checks.judge_prompt.replace("{question}", row["question"]).replace("{answer}", row["answer"])
        prompts.append([*system, {"role": "user", "content": text}])
    return prompts


def apply_checks(row: Row, generations: list[Generation], checks: TeacherChecks) -> None:
    """Judge one row from its check generations (in check_prompts order); rejects it in place."""
    row["num_generated_tokens"] = int(row.get("num_generated_tokens") or 0) + sum(
        g.num_generated_tokens for g in generations
    )
    samples, judged = generations[: checks.samples], generations[checks.samples :]
    if checks.samples:
        try:
            own = sampled_final(f"#### {final_answer(row['answer'])}")
        except AnswerError:
            own = None
        finals = [sampled_final(g.text) for g in samples]
        agree = sum(1 for f in finals if f is not None and f == own)
        if agree < checks.min_agree * checks.samples:
            errors = [g.error for g in samples if g.error]
            detail = f"{agree}/{checks.samples} samples agree with {own}; sampled {finals}"
            reject(row, STAGE, "self_consistency", detail + (f"; errors: {errors[:2]}" if errors else ""))
            return
    if judged:
        (verdict,) = judged
        score = judge_score(verdict.text)
        if verdict.error or score is None:
            reject(row, STAGE, "judge_unusable", verdict.error or verdict.text[:200])
        elif score < checks.min_score:
            reject(row, STAGE, "judge_low_score", f"score {score:g} < {checks.min_score}")


class TeacherCheckActor:
    """A Ray Data callable class: one teacher backend per actor, all checks of a batch in one call."""

    def __init__(self, cfg: GenerationConfig, checks: TeacherChecks) -> None:
        self.backend = build_backend(cfg)
        self.params = sampling_params(cfg)
        self.checks = checks

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        started = time.perf_counter()
        rows = batch.to_pylist()
        live = [r for r in rows if not r["reject_reason"]]
        prompts = [check_prompts(r, self.checks) for r in live]
        flat = [p for group in prompts for p in group]
        try:
            generations = self.backend.generate(flat, self.params) if flat else []
        except Exception as exc:  # a failed batch rejects its rows with the error, never loses them
            generations = [Generation("", finish_reason="error", error=f"{type(exc).__name__}: {exc}")] * len(flat)
        cursor = 0
        for row, group in zip(live, prompts, strict=True):
            apply_checks(row, generations[cursor : cursor + len(group)], self.checks)
            cursor += len(group)
        share = (time.perf_counter() - started) / max(1, len(rows))
        for row in rows:
            row[TIME_PREFIX + STAGE] = share
        return pa.Table.from_pylist(rows)


def apply_teacher_checks(ds: ray.data.Dataset, cfg: GenerationConfig, checks: TeacherChecks) -> ray.data.Dataset:
    """Add the teacher-check stage to the lazy dataset, with an actor pool sized like the generator's."""
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        TeacherCheckActor,
        fn_constructor_kwargs={"cfg": cfg, "checks": checks},
        batch_size=cfg.batch_size,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=cfg.concurrency),
        num_cpus=cfg.num_cpus_per_actor,
        num_gpus=cfg.num_gpus_per_actor,
    )
