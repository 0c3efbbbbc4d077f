"""The SDG pipeline's planners and bookkeeping, without Ray: stage plans, part files, resume, summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rayft.config import load_config
from rayft.config.sdg import TEST_MODE_SEEDS
from rayft.errors import DataError, RunStateError
from rayft.sdg.plan import plan_sdg, plan_stages, resolve_output_dir, sdg_config_hash
from rayft.sdg.rows import ROW_DEFAULTS, SEED_COLUMNS, ParseStage, QualityStage, parse_teacher_output
from rayft.sdg.runner import complete_seed_batches
from rayft.sdg.seeds import read_seeds
from rayft.sdg.stages import Stage, StageCall, check_plan
from rayft.sdg.store import SdgStore
from rayft.sdg.summary import build_summary, part_record


def row(seed: str, variation: int, rows: int, **kw: Any) -> dict[str, Any]:
    base = {**ROW_DEFAULTS, "seed_id": seed, "variation": variation, "seed_rows": rows}
    return {**base, "id": f"{seed}-{variation}", **kw}


@pytest.mark.parametrize("generator", ["symbolic", "llm"])
def test_stage_plans_are_consistent(generator: str) -> None:
    cfg = load_config(None, [f"sdg.generator={generator}"])
    stages = plan_stages(cfg.sdg, 1, "h")
    check_plan(stages, SEED_COLUMNS)
    assert stages[-1].name == "quality"


def test_a_stage_missing_a_column_is_named_before_anything_runs() -> None:
    cfg = load_config(None, [])
    stages = plan_stages(cfg.sdg, 1, "h")
    with pytest.raises(DataError, match=r"stage 'generate' needs column\(s\) \['seed_answer'\]"):
        check_plan(stages, {"seed_id", "seed_question"})


def test_stage_call_checks_real_batches_too() -> None:
    stage = Stage("double", frozenset({"x"}), frozenset({"y"}), lambda rows: [{**r, "y": 2 * r["x"]} for r in rows])
    out = StageCall(stage)(pa.table({"x": [1, 2]}))
    assert out.column("y").to_pylist() == [2, 4]
    assert "_seconds_double" in out.column_names
    with pytest.raises(DataError, match=r"stage 'double' got a batch without column\(s\) \['x'\]"):
        StageCall(stage)(pa.table({"z": [1]}))


def test_seed_batches_are_regrouped_so_no_seed_is_split() -> None:
    batches = [
        pa.Table.from_pylist([row("a", 0, 2), row("b", 0, 3)]),
        pa.Table.from_pylist([row("a", 1, 2), row("b", 1, 3)]),
        pa.Table.from_pylist([row("b", 2, 3), row("c", -1, 1)]),
    ]
    groups = [sorted((r["seed_id"], r["variation"]) for r in g) for g in complete_seed_batches(batches)]
    assert groups == [[("a", 0), ("a", 1)], [("b", 0), ("b", 1), ("b", 2), ("c", -1)]]
    with pytest.raises(DataError, match="lost rows"):
        list(complete_seed_batches([pa.Table.from_pylist([row("a", 0, 2)])]))


def test_parts_commit_resume_and_refuse_another_config(tmp_path: Path) -> None:
    store = SdgStore(tmp_path / "out")
    store.open("h1")
    rows = [row("a", 0, 1, question="q1"), row("b", 0, 1, reject_stage="quality", reject_reason="r")]
    store.commit_part(1, rows[:1], rows[1:], part_record(rows, ["a", "b"], {}))
    # A crash after writing a part's rows but before its commit record leaves an orphan.
    (store.parts / "part-000002.accepted.parquet").write_bytes(b"partial")
    reopened = SdgStore(tmp_path / "out")
    reopened.open("h1")
    assert not (store.parts / "part-000002.accepted.parquet").exists()
    assert reopened.done_seeds() == {"a", "b"}
    assert reopened.next_part() == 2
    assert [r["question"] for r in reopened.committed_accepted()] == ["q1"]
    assert reopened.consolidate() == (1, 1)
    lines = reopened.data_jsonl.read_text().splitlines()
    assert json.loads(lines[0])["question"] == "q1" and "seed_rows" not in json.loads(lines[0])
    with pytest.raises(RunStateError, match="another sdg config"):
        SdgStore(tmp_path / "out").open("h2")


def test_config_hash_ignores_sizes_but_not_content() -> None:
    base = load_config(None, []).sdg
    assert sdg_config_hash(base, 1) == sdg_config_hash(base.model_copy(update={"num_seeds": 5}), 1)
    assert sdg_config_hash(base, 1) != sdg_config_hash(base.model_copy(update={"variations": 5}), 1)
    assert sdg_config_hash(base, 1) != sdg_config_hash(base, 2)


def test_default_output_dir(tmp_path: Path) -> None:
    cfg = load_config(None, [f"storage_path={tmp_path}", "name=x"])
    assert resolve_output_dir(cfg, None) == tmp_path / "x" / "sdg"
    explicit = load_config(None, ["sdg.output_dir=/o"])
    assert resolve_output_dir(explicit, None) == Path("/o")
    assert resolve_output_dir(explicit, tmp_path) == tmp_path


def test_seed_columns_are_checked_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "seeds.jsonl"
    path.write_text(json.dumps({"problem": "What is 2+2?", "solution": "2+2=<<2+2=4>>4\n#### 4"}) + "\n")
    cfg = load_config(None, [f"sdg.seeds.path={path}"])
    with pytest.raises(DataError, match=r"no column\(s\) \['question', 'answer'\].*sdg.question_column"):
        read_seeds(cfg.sdg)
    cfg = load_config(None, [f"sdg.seeds.path={path}", "sdg.question_column=problem", "sdg.answer_column=solution"])
    (seed,) = read_seeds(cfg.sdg)
    assert seed["seed_question"] == "What is 2+2?"


def test_summary_counts_every_stage() -> None:
    rows = [
        row("a", 0, 2, num_generated_tokens=10),
        row("a", 1, 2, reject_stage="quality", reject_reason="math_final_mismatch", num_generated_tokens=7),
        row("b", -1, 1, reject_stage="seed", reject_reason="no_variable_numbers"),
    ]
    summary = build_summary(
        [part_record(rows, ["a", "b"], {"generate": 1.5})],
        variations=2,
        seeds_requested=2,
        seeds_done_before=0,
        wall_seconds={"total": 3.0},
    )
    assert summary["seeds"]["skipped"] == 1
    assert summary["rows"] == {"requested": 4, "candidates": 2, "accepted": 1}
    quality = next(s for s in summary["stages"] if s["stage"] == "quality")
    assert quality == {"stage": "quality", "rows_in": 2, "rejected": 1, "rows_out": 1}
    assert summary["rejection_reasons"] == {"quality/math_final_mismatch": 1, "seed/no_variable_numbers": 1}
    assert summary["acceptance_rate"] == 0.25
    assert summary["tokens_generated"] == 17


def test_teacher_output_parsing_and_failed_generations() -> None:
    text = "Problem: Sam has 3 boxes of 4 pens. How many pens?\nSolution:\n3*4 = <<3*4=12>>12\n#### 12\nProblem: more"
    expected = ("Sam has 3 boxes of 4 pens. How many pens?", "3*4 = <<3*4=12>>12\n#### 12")
    assert parse_teacher_output(text, "math") == expected
    assert parse_teacher_output("I cannot help.", "math") is None
    rows = [
        row("a", 0, 3, generation=text, generator="hf:m"),
        row("a", 1, 3, generation="", error="TimeoutError: read timed out", generator="hf:m"),
        row("a", 2, 3, generation="Sure! Here is one.", generator="hf:m"),
    ]
    ParseStage("math")(rows)
    QualityStage(True, 10, 1000, 1, 1000)(rows)
    assert [(r["reject_stage"], r["reject_reason"]) for r in rows] == [
        ("", ""),
        ("generate", "generation_error"),
        ("parse", "unparsable_generation"),
    ]
    assert rows[1]["error"].startswith("TimeoutError") and rows[0]["model"] == "hf:m"


def test_teacher_checks_self_consistency_and_judge() -> None:
    from rayft.generation.backend import Generation
    from rayft.sdg.teacher_checks import TeacherChecks, apply_checks, check_prompts, judge_score, sampled_final

    assert sampled_final("so 3+4=7\n#### 1,200.50") == "1200.5"
    assert sampled_final("no final line") is None
    assert judge_score("Score: 8/10") == 8 and judge_score("great!") is None
    checks = TeacherChecks(2, 0.5, True, 7, "Solve: {question}", "Rate {question} / {answer}", None)
    good = row("a", 0, 1, question="Q?", answer="2*3 = <<2*3=6>>6\n#### 6")
    prompts = check_prompts(good, checks)
    assert len(prompts) == 3 and prompts[0][-1]["content"] == "Solve: Q?"
    assert "Rate Q? / 2*3" in str(prompts[2])
    apply_checks(good, [Generation("#### 6", 0, 4), Generation("#### 5", 0, 4), Generation("Score: 9", 0, 2)], checks)
    assert good["reject_reason"] == "" and good["num_generated_tokens"] == 10
    wrong = row("b", 0, 1, question="Q?", answer="2*3 = <<2*3=6>>6\n#### 6")
    apply_checks(wrong, [Generation("#### 5"), Generation("", error="boom"), Generation("Score: 9")], checks)
    assert (wrong["reject_stage"], wrong["reject_reason"]) == ("teacher_checks", "self_consistency")
    assert "0/2 samples agree" in wrong["reject_detail"] and "boom" in wrong["reject_detail"]
    low = row("c", 0, 1, question="Q?", answer="2*3 = <<2*3=6>>6\n#### 6")
    apply_checks(low, [Generation("#### 6"), Generation("#### 6"), Generation("Score: 3")], checks)
    assert (low["reject_reason"], low["reject_detail"]) == ("judge_low_score", "score 3 < 7")


def test_teacher_check_stage_is_planned_only_when_asked() -> None:
    assert [s.name for s in plan_stages(load_config(None, []).sdg, 1, "h")] == ["generate", "quality"]
    cfg = load_config(None, ["sdg.generator=llm", "sdg.quality.self_consistency=3", "sdg.quality.judge=true"])
    stages = plan_stages(cfg.sdg, 1, "h")
    check_plan(stages, SEED_COLUMNS)
    assert [s.name for s in stages][-1] == "teacher_checks"


def test_instruction_task_parses_free_form_pairs_without_math_checks() -> None:
    text = "Instruction: Name three primary colours.\nResponse: Red, yellow and blue."
    assert parse_teacher_output(text, "instruction") == ("Name three primary colours.", "Red, yellow and blue.")
    rows = [row("a", 0, 1, generation=text, generator="hf:m")]
    ParseStage("instruction")(rows)
    QualityStage(False, 10, 1000, 1, 1000)(rows)
    assert rows[0]["reject_reason"] == "" and rows[0]["answer"] == "Red, yellow and blue."


def test_cli_reports_bad_seed_columns_without_a_traceback(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"problem": "What is 2+2?"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"sdg:\n  seeds:\n    path: {seeds}\n")
    result = CliRunner().invoke(cli, ["sdg", str(config), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "Error: sdg seeds" in result.output and "sdg.question_column" in result.output
    assert "Traceback" not in result.output


def test_plan_sdg_cuts_a_test_run_and_takes_the_config_seed_when_sdg_has_none() -> None:
    cfg = load_config(None, ["sdg.num_seeds=50"])
    plan = plan_sdg(cfg.sdg, 7)
    assert (plan.sdg.num_seeds, plan.rng_seed) == (50, 7)
    assert plan.config_hash == sdg_config_hash(cfg.sdg, 7)
    assert [s.name for s in plan.stages] == [s.name for s in plan_stages(cfg.sdg, 7, plan.config_hash)]
    smoke = plan_sdg(cfg.sdg, 7, test_mode=True)
    assert smoke.sdg.num_seeds == TEST_MODE_SEEDS and smoke.config_hash == plan.config_hash  # resumes the same rows
    assert plan_sdg(cfg.sdg.model_copy(update={"seed": 3}), 7).rng_seed == 3
