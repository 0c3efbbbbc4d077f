"""Config sections for synthetic data generation (``rayft sdg``): seeds, generator, quality, dedup."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rayft.config.base import Section
from rayft.config.data import DatasetConfig
from rayft.config.generation import GenerationConfig

TEST_MODE_SEEDS = 2
"""The seeds of a smoke run (``rayft sdg --test-mode``): enough to run every stage in seconds."""

DEFAULT_VARIATION_PROMPT = (
    "Here is a grade-school math word problem and its step-by-step solution.\n\n"
    "Problem: {question}\n\nSolution:\n{answer}\n\n"
    "Write one NEW problem of the same kind with a different story and different numbers, then solve "
    "it step by step. Write every calculation as <<expression=result>> right after it, and end with "
    "a last line '#### <final number>'. Answer in exactly this format:\n"
    "Problem: <the new problem>\nSolution:\n<the steps>\n#### <final number>"
)
DEFAULT_SOLVE_PROMPT = (
    "Solve this grade-school math problem step by step. End with a last line '#### <final number>'.\n\n"
    "Problem: {question}"
)
DEFAULT_JUDGE_PROMPT = (
    "Rate the following problem and its solution for correctness, clarity and usefulness as training "
    "data, on a scale from 1 (useless or wrong) to 10 (excellent). Reply with one line 'Score: <N>'.\n\n"
    "Problem: {question}\n\nSolution:\n{answer}"
)
DEFAULT_INSTRUCTION_PROMPT = (
    "Here is an example of an instruction and a good response.\n\n"
    "Instruction: {question}\n\nResponse: {answer}\n\n"
    "Write one NEW instruction on a different topic of the same kind, and a good response to it. "
    "Answer in exactly this format:\nInstruction: <the new instruction>\nResponse: <the response>"
)


def _default_teacher() -> GenerationConfig:
    return GenerationConfig(temperature=0.8, top_p=0.95, max_new_tokens=384, batch_size=16)


class SdgPromptsConfig(Section):
    """Prompts sent to an LLM teacher; {question} and {answer} are filled from each seed."""

    system: str | None = Field(
        "You are a careful teacher who writes new practice problems with correct solutions.",
        description="System message put before every teacher prompt (none when null).",
    )
    math_variation: str = Field(
        DEFAULT_VARIATION_PROMPT,
        description="User prompt for task 'math': one new GSM8K-style problem with an annotated solution.",
    )
    instruction: str = Field(
        DEFAULT_INSTRUCTION_PROMPT,
        description="User prompt for task 'instruction': one new free-form instruction and its response.",
    )
    solve: str = Field(
        DEFAULT_SOLVE_PROMPT,
        description="Prompt of the self-consistency check: the teacher solves a generated {question} again.",
    )
    judge: str = Field(
        DEFAULT_JUDGE_PROMPT,
        description="Prompt of the LLM judge, with {question} and {answer}; the reply must contain 'Score: N'.",
    )


class SdgQualityConfig(Section):
    """Checks every generated row must pass; failures are kept in rejected.jsonl with their reason."""

    verify_math: bool = Field(
        True,
        description=(
            "For task 'math': exactly one final '#### N' line, every <<a*b=c>> annotation re-computed "
            "exactly, and N equal to the last annotation's result."
        ),
    )
    min_question_chars: int = Field(20, ge=0, description="Shortest accepted question, in characters.")
    max_question_chars: int = Field(2000, gt=0, description="Longest accepted question, in characters.")
    min_answer_chars: int = Field(1, ge=0, description="Shortest accepted answer, in characters.")
    max_answer_chars: int = Field(4000, gt=0, description="Longest accepted answer, in characters.")
    self_consistency: int = Field(
        0,
        ge=0,
        description=(
            "Task 'math': the teacher solves each generated problem this many more times (sampled); the row "
            "is kept only when enough final answers equal its own (0: off). Costs k generations per row."
        ),
    )
    self_consistency_min_agree: float = Field(
        0.5, gt=0, le=1, description="Share of the self-consistency samples whose '#### N' must equal the row's."
    )
    judge: bool = Field(
        False, description="Ask the teacher to score every row (prompts.judge) and drop rows below judge_min_score."
    )
    judge_min_score: int = Field(7, ge=1, le=10, description="Lowest judge score (1-10) a row may have.")


class SdgDedupConfig(Section):
    """Removing exact and near duplicates, across the whole output (including rows of earlier runs)."""

    exact: bool = Field(True, description="Drop a row whose normalised question (case, spaces) was seen before.")
    near: bool = Field(
        True,
        description=(
            "Drop a row whose question is a near duplicate (MinHash LSH estimate of word-shingle "
            "Jaccard similarity >= near_threshold) of a row kept from ANOTHER seed. Numbers are "
            "masked, so problems differing only by numbers count as the same wording; variations of "
            "one seed are meant to share their wording and are not compared with each other."
        ),
    )
    near_threshold: float = Field(
        0.85, gt=0, le=1, description="Jaccard similarity at which two questions are near duplicates."
    )
    shingle_words: int = Field(3, gt=0, description="Words per shingle for near-duplicate detection.")
    num_perm: int = Field(128, ge=16, description="MinHash permutations (more: a closer estimate, slower).")
    bands: int = Field(32, ge=1, description="LSH bands; num_perm must be a multiple of bands.")


class SdgDecontaminationConfig(Section):
    """Keeping evaluation problems out of the training data (word n-gram overlap, numbers masked)."""

    datasets: list[DatasetConfig] = Field(
        default_factory=list,
        description=(
            "Evaluation sets whose problems must not leak into the output, e.g. "
            "[{path: builtin:arithmetic, split: test}] or a local GSM8K test.jsonl (none: no check)."
        ),
    )
    question_column: str = Field("question", description="Column of the evaluation sets holding the problem text.")
    ngram_words: int = Field(
        10, gt=0, description="A row sharing any word n-gram of this length with an evaluation problem is rejected."
    )
    mask_numbers: bool = Field(
        True, description="Compare with numbers masked, so a test problem with changed numbers still counts as leaked."
    )


class SdgConfig(Section):
    """Synthetic data generation: seed problems in, verified and deduplicated new problems out."""

    seeds: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(path="builtin:arithmetic"),
        description="Seed problems: a local file, a Hub dataset, or builtin:arithmetic (offline, the default).",
    )
    question_column: str = Field("question", description="Seed column holding the problem (instruction).")
    answer_column: str = Field("answer", description="Seed column holding the solution (response).")
    num_seeds: int | None = Field(100, gt=0, description="Use the first N seeds (all when null).")
    variations: int = Field(3, gt=0, description="New rows to generate per seed (K).")
    generator: Literal["symbolic", "llm"] = Field(
        "symbolic",
        description=(
            "'symbolic': new numbers in the seed's annotated solution, re-computed (offline, fast, "
            "math only); 'llm': a teacher model writes new problems (see teacher, prompts)."
        ),
    )
    task: Literal["math", "instruction"] = Field(
        "math",
        description=(
            "'math': GSM8K-style rows verified by their annotations; 'instruction': free-form "
            "instruction/response pairs (generator 'llm' only)."
        ),
    )
    teacher: GenerationConfig = Field(
        default_factory=_default_teacher,
        description="The teacher model and backend (hf, vllm, openai) for generator 'llm'.",
    )
    prompts: SdgPromptsConfig = Field(default_factory=SdgPromptsConfig, description="Teacher prompts.")
    quality: SdgQualityConfig = Field(default_factory=SdgQualityConfig, description="Row quality checks.")
    dedup: SdgDedupConfig = Field(default_factory=SdgDedupConfig, description="Duplicate removal.")
    decontamination: SdgDecontaminationConfig = Field(
        default_factory=SdgDecontaminationConfig, description="Evaluation-set leak checks."
    )
    max_attempts: int = Field(
        50, gt=0, description="Symbolic generator: number draws per variation before giving up on it (counted)."
    )
    operand_scale: int = Field(
        1,
        ge=1,
        description=(
            "Symbolic generator: multiply each varied number of a seed by this factor before drawing near it, "
            "e.g. 1000 for large-operand arithmetic where a calculator matters (draws that make a division "
            "inexact are redrawn, up to max_attempts)."
        ),
    )
    tool_use: bool = Field(
        False,
        description=(
            "Task 'math': write each accepted row also as a tool-use trace, every <<expression=result>> step "
            "a call of a 'calculator' tool and its result, then the solution (columns messages and tools, "
            "JSON text; format auto trains on them as a tool-use conversation)."
        ),
    )
    seeds_per_batch: int = Field(
        64,
        gt=0,
        description="Seeds per Ray Data batch; each batch's rows are committed as one part file (the resume unit).",
    )
    seed: int | None = Field(None, ge=0, description="Seed of the number draws and sampling (default: the run's seed).")
    output_dir: str | None = Field(None, description="Where rows are written (default: <storage_path>/<name>/sdg).")

    @model_validator(mode="after")
    def _tool_use_needs_math(self) -> SdgConfig:
        if self.tool_use and self.task != "math":
            raise ValueError(
                f"sdg.tool_use makes calculator traces from math solutions, but sdg.task is {self.task!r}; "
                "set sdg.task=math or sdg.tool_use=false"
            )
        return self
