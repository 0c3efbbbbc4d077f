"""The SDG plan, decided before anything runs: where the rows go, the hash of the settings that
decide which rows are made (so that a rerun resumes only onto rows made the same way), and the lazy
Ray Data stages for the configured generator. Pure functions of the config, unit-tested without Ray."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rayft.config import RayftConfig
from rayft.config.sdg import TEST_MODE_SEEDS, SdgConfig
from rayft.runs.location import local_run_dir
from rayft.sdg.rows import SEED_COLUMNS, ParseStage, PromptStage, QualityStage, SymbolicStage
from rayft.sdg.stages import Stage, check_plan
from rayft.sdg.teacher_checks import STAGE as TEACHER_CHECKS
from rayft.sdg.teacher_checks import TeacherChecks
from rayft.sdg.tool_traces import TRACE_COLUMNS, ToolTraceStage

GENERATION_COLUMNS = frozenset({"generation", "finish_reason", "error", "num_prompt_tokens", "num_generated_tokens"})
ROW_COLUMNS = frozenset({"id", "seed_id", "variation", "question", "answer", "reject_reason", "seed_rows"})
# Fields that do not change which rows are made: they may differ when a run is resumed.
_VOLATILE_FIELDS = ("num_seeds", "output_dir", "seeds_per_batch")
_VOLATILE_TEACHER_FIELDS = ("batch_size", "concurrency", "num_cpus_per_actor", "num_gpus_per_actor", "endpoint")


@dataclass(frozen=True)
class SdgPlan:
    """The sdg section as it runs (``num_seeds`` cut for a test run), its random seed, the hash of
    the settings that decide the rows, and the checked stages."""

    sdg: SdgConfig
    rng_seed: int
    config_hash: str
    stages: list[Stage]
    extra_columns: tuple[str, ...] = ()  # output columns beyond the usual ones (tool-use traces)


def plan_sdg(sdg: SdgConfig, default_seed: int, *, test_mode: bool = False) -> SdgPlan:
    """The plan for ``sdg`` (``default_seed``, the config's seed, when ``sdg.seed`` is unset)."""
    if test_mode:
        sdg = sdg.model_copy(update={"num_seeds": TEST_MODE_SEEDS})
    rng_seed = sdg.seed if sdg.seed is not None else default_seed
    config_hash = sdg_config_hash(sdg, rng_seed)
    stages = plan_stages(sdg, rng_seed, config_hash)
    check_plan(stages, SEED_COLUMNS)
    return SdgPlan(sdg, rng_seed, config_hash, stages, TRACE_COLUMNS if sdg.tool_use else ())


def resolve_output_dir(cfg: RayftConfig, output_dir: Path | None) -> Path:
    """The explicit directory, else ``sdg.output_dir``, else ``<storage_path>/<name>/sdg``."""
    if output_dir is not None:
        return Path(output_dir)
    if cfg.sdg.output_dir:
        return Path(cfg.sdg.output_dir)
    fix = "set sdg.output_dir=/a/local/dir"
    return local_run_dir(cfg.storage_path, cfg.name, command="rayft sdg", fix=fix) / "sdg"


def sdg_config_hash(sdg: SdgConfig, rng_seed: int) -> str:
    """A hash of every setting that changes which rows are made (not sizes or scaling)."""
    data = sdg.model_dump(mode="json", exclude=set(_VOLATILE_FIELDS))
    if sdg.generator == "symbolic":
        data.pop("teacher"), data.pop("prompts")
    else:
        for key in _VOLATILE_TEACHER_FIELDS:
            data["teacher"].pop(key)
    data["rng_seed"] = rng_seed
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def plan_stages(sdg: SdgConfig, rng_seed: int, config_hash: str) -> list[Stage]:
    """The Ray Data stages for the configured generator, in order (a pure planner: nothing runs)."""
    quality = Stage(
        "quality",
        ROW_COLUMNS,
        frozenset(),
        QualityStage(
            verify_math=sdg.quality.verify_math and sdg.task == "math",
            min_question_chars=sdg.quality.min_question_chars,
            max_question_chars=sdg.quality.max_question_chars,
            min_answer_chars=sdg.quality.min_answer_chars,
            max_answer_chars=sdg.quality.max_answer_chars,
        ),
    )
    checks = [*plan_teacher_checks(sdg)]
    if sdg.tool_use:  # last: a trace is made from the row as the checks leave it
        checks.append(Stage("tool_traces", ROW_COLUMNS, frozenset(TRACE_COLUMNS), ToolTraceStage()))
    if sdg.generator == "symbolic":
        generate = SymbolicStage(sdg.variations, sdg.max_attempts, rng_seed, config_hash, sdg.operand_scale)
        return [Stage("generate", SEED_COLUMNS, ROW_COLUMNS, generate), quality, *checks]
    teacher = sdg.teacher
    sampling = json.dumps(
        {"temperature": teacher.temperature, "top_p": teacher.top_p, "max_new_tokens": teacher.max_new_tokens}
    )
    template = sdg.prompts.math_variation if sdg.task == "math" else sdg.prompts.instruction
    prompts = PromptStage(template, sdg.prompts.system, sdg.variations, teacher.model.name, sampling, config_hash)
    return [
        Stage("prompts", SEED_COLUMNS, ROW_COLUMNS | {"messages"}, prompts),
        Stage("generate", frozenset({"messages"}), GENERATION_COLUMNS, None),
        Stage("parse", ROW_COLUMNS | GENERATION_COLUMNS, frozenset(), ParseStage(sdg.task)),
        quality,
        *checks,
    ]


def plan_teacher_checks(sdg: SdgConfig) -> list[Stage]:
    """The optional stage that asks the teacher (self-consistency, judge); empty when both are off."""
    q = sdg.quality
    samples = q.self_consistency if sdg.task == "math" else 0
    if not samples and not q.judge:
        return []
    checks = TeacherChecks(
        samples=samples,
        min_agree=q.self_consistency_min_agree,
        judge=q.judge,
        min_score=q.judge_min_score,
        solve_prompt=sdg.prompts.solve,
        judge_prompt=sdg.prompts.judge,
        system=sdg.prompts.system,
    )
    return [Stage(TEACHER_CHECKS, ROW_COLUMNS, frozenset(), None, options={"checks": checks})]
