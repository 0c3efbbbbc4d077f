"""The SDG row: its columns, and the stage functions that make and judge rows.

Every row carries its provenance (seed, generator, model, prompt, sampling parameters, config
hash) and a stable id derived from the seed, the variation number and the config hash, so a
rerun produces the same ids. A row that fails anywhere keeps flowing with ``reject_stage`` and
``reject_reason`` set (and ``error`` for failed generations); the driver writes it to
rejected.jsonl instead of dropping it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from rayft.sdg.mathcheck import check_math_answer
from rayft.sdg.stages import Row
from rayft.sdg.symbolic import UnusableSeedError, analyze_seed, make_variation

# Columns of every output row (accepted and rejected), with the value a row starts with.
ROW_DEFAULTS: dict[str, Any] = {
    "id": "",
    "seed_id": "",
    "variation": -1,
    "question": "",
    "answer": "",
    "generator": "",
    "model": "",
    "prompt": "",
    "sampling": "",
    "config_hash": "",
    "seed_question": "",
    "num_generated_tokens": 0,
    "finish_reason": "",
    "error": "",
    "reject_stage": "",
    "reject_reason": "",
    "reject_detail": "",
    "seed_rows": 0,
}
OUTPUT_COLUMNS = tuple(c for c in ROW_DEFAULTS if c != "seed_rows")
SEED_COLUMNS = frozenset({"seed_id", "seed_question", "seed_answer"})


def seed_id(question: str, answer: str) -> str:
    """A stable id of a seed from its content (independent of its position in the file)."""
    return hashlib.sha1(f"{question}\n\x00{answer}".encode()).hexdigest()[:16]


def row_id(seed: str, variation: int, config_hash: str) -> str:
    """A stable id of a generated row."""
    return hashlib.sha1(f"{seed}:{variation}:{config_hash}".encode()).hexdigest()[:16]


def reject(row: Row, stage: str, reason: str, detail: str = "") -> Row:
    """Mark ``row`` as rejected by ``stage`` (the first rejection wins)."""
    if not row["reject_reason"]:
        row.update(reject_stage=stage, reject_reason=reason, reject_detail=detail[:500])
    return row


@dataclass(frozen=True)
class SymbolicStage:
    """Stage function: K symbolic variations per seed row (or one rejected row explaining the skip)."""

    variations: int
    max_attempts: int
    seed: int
    config_hash: str
    operand_scale: int = 1  # the factor applied to the seed's varied numbers before a draw

    def __call__(self, seeds: list[Row]) -> list[Row]:
        out: list[Row] = []
        settings: dict[str, int] = {"seed": self.seed, "max_attempts": self.max_attempts}
        if self.operand_scale != 1:
            settings["operand_scale"] = self.operand_scale
        sampling = json.dumps(settings)
        for seed in seeds:
            base = {**ROW_DEFAULTS, "seed_id": seed["seed_id"], "seed_question": seed["seed_question"]}
            base.update(generator="symbolic", sampling=sampling, config_hash=self.config_hash)
            try:
                chain = analyze_seed(seed["seed_question"], seed["seed_answer"])
            except UnusableSeedError as skip:
                unusable = {**base, "seed_rows": 1, "id": row_id(seed["seed_id"], -1, self.config_hash)}
                out.append(reject(unusable, "seed", skip.reason, str(skip)))
                continue
            rng = random.Random(f"{self.seed}:{seed['seed_id']}")
            for k in range(self.variations):
                row = {**base, "variation": k, "seed_rows": self.variations}
                row["id"] = row_id(seed["seed_id"], k, self.config_hash)
                made = make_variation(chain, rng, self.max_attempts, self.operand_scale)
                if made is None:
                    reject(row, "generate", "no_valid_variation", f"no valid numbers in {self.max_attempts} draws")
                else:
                    row["question"], row["answer"] = made
                out.append(row)
        return out


@dataclass(frozen=True)
class PromptStage:
    """Stage function: K teacher prompts per seed row (chat messages with the seed filled in)."""

    template: str
    system: str | None
    variations: int
    model: str
    sampling: str
    config_hash: str

    def __call__(self, seeds: list[Row]) -> list[Row]:
        out: list[Row] = []
        for seed in seeds:
            text = self.template.replace("{question}", seed["seed_question"]).replace("{answer}", seed["seed_answer"])
            messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
                {"role": "user", "content": text}
            ]
            for k in range(self.variations):
                row = {**ROW_DEFAULTS, "seed_id": seed["seed_id"], "seed_question": seed["seed_question"]}
                row.update(
                    id=row_id(seed["seed_id"], k, self.config_hash),
                    variation=k,
                    seed_rows=self.variations,
                    generator="llm",
                    model=self.model,
                    prompt=json.dumps(messages),
                    sampling=self.sampling,
                    config_hash=self.config_hash,
                    messages=messages,
                )
                out.append(row)
        return out


_MATH_OUTPUT = re.compile(r"(?:problem|question)\s*:\s*(?P<q>.+?)\s*(?:solution|answer)\s*:\s*(?P<a>.+)", re.S | re.I)
_INSTRUCTION_OUTPUT = re.compile(r"instruction\s*:\s*(?P<q>.+?)\s*response\s*:\s*(?P<a>.+)", re.S | re.I)


def parse_teacher_output(text: str, task: str) -> tuple[str, str] | None:
    """The (question, answer) a teacher wrote in the prompt's format, or None when it did not."""
    match = (_MATH_OUTPUT if task == "math" else _INSTRUCTION_OUTPUT).search(text)
    if match is None:
        return None
    question, answer = match.group("q").strip(), match.group("a").strip()
    if task == "math" and "####" in answer:
        # Anything after the final line (a second problem, chatter) is not part of the answer.
        head, _, tail = answer.partition("####")
        answer = f"{head.rstrip()}\n#### {tail.strip().splitlines()[0].strip() if tail.strip() else ''}".strip()
    return (question, answer) if question and answer else None


@dataclass(frozen=True)
class ParseStage:
    """Stage function: teacher generations become question/answer, or rows rejected with the reason."""

    task: str

    def __call__(self, rows: list[Row]) -> list[Row]:
        for row in rows:
            row.pop("messages", None)
            row["model"], row["generator"] = row.get("generator") or row["model"], "llm"
            row["error"] = row.get("error") or ""
            if row["error"]:
                reject(row, "generate", "generation_error", row["error"])
                continue
            parsed = parse_teacher_output(str(row.get("generation") or ""), self.task)
            if parsed is None:
                reject(row, "parse", "unparsable_generation", str(row.get("generation") or "")[:300])
            else:
                row["question"], row["answer"] = parsed
        return rows


@dataclass(frozen=True)
class QualityStage:
    """Stage function: length bounds and, for math, the annotation and final-answer checks."""

    verify_math: bool
    min_question_chars: int
    max_question_chars: int
    min_answer_chars: int
    max_answer_chars: int

    def __call__(self, rows: list[Row]) -> list[Row]:
        for row in rows:
            if not row["reject_reason"]:
                reason = self.check(row["question"], row["answer"])
                if reason:
                    reject(row, "quality", reason)
        return rows

    def check(self, question: str, answer: str) -> str | None:
        """Why a question/answer pair fails the checks, or None."""
        if not self.min_question_chars <= len(question) <= self.max_question_chars:
            return "question_length"
        if not self.min_answer_chars <= len(answer) <= self.max_answer_chars:
            return "answer_length"
        if self.verify_math:
            reason = check_math_answer(answer)
            return f"math_{reason}" if reason else None
        return None
