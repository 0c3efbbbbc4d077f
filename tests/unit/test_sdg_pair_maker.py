"""The pair maker without Ray: its plan (prompts, the checker, problems screened out), each problem's
verdict written as pairs or a reason, and counts that add up whatever happens to the samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rayft.config import load_config
from rayft.config.pairs import PairsConfig
from rayft.errors import ConfigError, DataError
from rayft.files import AtomicJsonl
from rayft.models.sources import ResolvedSource
from rayft.recipes.pairs import Gsm8kChecker
from rayft.sdg.dedup import NgramIndex
from rayft.sdg.pair_maker import _Sink, iter_problems, pair_problem
from rayft.sdg.pair_plan import (
    plan_pairs,
    problem_prompt,
    problem_row,
    sample_blocks,
    sample_rows,
    screen_problem,
)
from rayft.sdg.pairs import NO_PAIR_REASONS, PairCounts
from rayft.sdg.runner import complete_seed_batches

STRICT = Gsm8kChecker("strict")
NO_LEAKS = NgramIndex([], n=5, mask_numbers=True)


def test_the_checker_reads_answers_as_the_gsm8k_eval_task_does() -> None:
    assert STRICT.reference("3 + 4 = 7\n#### 7") == "7"
    assert STRICT.reference("the answer is seven") is None
    assert STRICT.is_correct("so 3 + 4 = 7\n#### 7", "7") and not STRICT.is_correct("#### 8", "7")
    assert not STRICT.parses("it is 7") and STRICT.parses("#### 1,000")
    assert STRICT.is_correct("#### 1,000", "1000")
    flexible = Gsm8kChecker("flexible")
    assert flexible.parses("it is 7") and flexible.is_correct("it is 7.", "7")


def test_a_problem_is_a_chat_or_a_raw_prompt_with_the_question_in_the_template() -> None:
    pairs = PairsConfig(system_prompt="Be brief.")
    text, chat = problem_prompt("What is 2+2?", pairs)
    assert text == "Question: What is 2+2?\nAnswer:"
    assert chat == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    raw_text, raw = problem_prompt("What is 2+2?", pairs.model_copy(update={"use_chat_template": False}))
    assert raw == raw_text == text
    with pytest.raises(ValueError, match=r"has no \{question\}"):
        PairsConfig(prompt_template="Answer:")


def test_problems_without_a_final_answer_or_leaked_from_the_eval_set_are_not_sampled() -> None:
    leaks = NgramIndex(["Tom has 5 apples and buys 3 more apples at the shop"], n=5, mask_numbers=True)
    assert screen_problem("Ann has 2 pens.", "#### 2", STRICT, leaks) is None
    bad = screen_problem("Ann has 2 pens.", "two", STRICT, leaks)
    assert bad is not None and bad[0] == "bad_reference"
    leaked = screen_problem("Tom has 9 apples and buys 1 more apples at the shop", "#### 10", STRICT, leaks)
    assert leaked is not None and leaked[0] == "eval_overlap" and "apples" in leaked[1]


def test_the_plan_samples_from_the_resolved_model_with_the_run_seed(tmp_path: Path) -> None:
    cfg = load_config(None, ["pairs.generation.temperature=0.7"])
    resolved = ResolvedSource("runs/x/train", "lora", cfg.model, adapter_path=str(tmp_path))
    plan = plan_pairs(cfg.pairs, resolved, default_seed=11)
    assert plan.sampler.adapter_path == str(tmp_path) and plan.sampler.model == cfg.model
    assert plan.sampler.seed == 11 and plan.rng_seed == 11 and plan.sampler.temperature == 0.7
    assert "LoRA adapter" in plan.model
    seeded = plan_pairs(cfg.pairs.model_copy(update={"seed": 3}), resolved, default_seed=11)
    assert seeded.rng_seed == 3 and seeded.sampler.seed == 3


def test_problems_are_read_lazily_once_each_up_to_num_problems(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"question": f"q{i % 3}", "answer": f"#### {i % 3}"} for i in range(9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = PairsConfig(problems={"path": str(path)}, num_problems=2)
    assert list(iter_problems(pairs)) == [("q0", "#### 0"), ("q1", "#### 1")]
    assert len(list(iter_problems(pairs.model_copy(update={"num_problems": None})))) == 3
    path.write_text(json.dumps({"problem": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(DataError, match=r"'question' and 'answer' must be non-empty text.*pairs.question_column"):
        list(iter_problems(pairs))


def sampled(question: str, answer: str, generations: list[str], errors: list[str] | None = None) -> list[Any]:
    """A problem's rows as the sampler gives them back (shuffled, an error where a generation failed)."""
    row = problem_row(question, str(STRICT.reference(answer)), answer, PairsConfig())
    errors = errors or [""] * len(generations)
    rows = [{**r, "generation": g, "error": e}
            for r, g, e in zip(sample_rows(row, len(generations)), generations, errors, strict=True)]  # fmt: skip
    return rows[::-1]


def run_problems(tmp_path: Path, problems: list[list[dict[str, Any]]], skipped: int = 0) -> tuple[PairCounts, Path]:
    cfg = load_config(None, [])
    plan = plan_pairs(cfg.pairs, ResolvedSource("m", "model", cfg.model), default_seed=0)
    with AtomicJsonl(tmp_path / "data.jsonl") as data, AtomicJsonl(tmp_path / "no_pair.jsonl") as no_pair:
        sink = _Sink(data, no_pair, PairCounts())
        for index in range(skipped):
            sink.skip(f"s{index}", "q", "eval_overlap", "leaked")
        for rows in problems:
            pair_problem(rows, plan, STRICT, sink)
        data.commit()
        no_pair.commit()
    return sink.counts, tmp_path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_problem_gives_pairs_or_one_reason_and_the_counts_add_up(tmp_path: Path) -> None:
    problems = [
        sampled("A", "#### 4", ["2+2=4\n#### 4", "2+2=5\n#### 5", "2+2=4 so\n#### 4"]),
        sampled("B", "#### 4", ["#### 4", "#### 4.", "#### 4"]),
        sampled("C", "#### 4", ["#### 5", "four", "#### 6"]),
        sampled("D", "#### 4", ["four", "4", "it is four"]),
        sampled("E", "#### 4", ["", "", ""], errors=["HTTP 500", "HTTP 500", "timeout"]),
        sampled("F", "#### 4", ["#### 4", "", "#### 7"], errors=["", "timeout", ""]),
    ]
    counts, out = run_problems(tmp_path, problems, skipped=2)
    summary = counts.as_dict()
    assert summary["no_pair"] == {"eval_overlap": 2, "generation_failed": 1, "no_correct_sample": 1,
                                  "no_parseable_sample": 1, "no_wrong_sample": 1}  # fmt: skip
    assert summary["problems"] == 8 == summary["problems_with_pairs"] + sum(summary["no_pair"].values())
    assert summary["problems_with_pairs"] == 2 and summary["pairs"] == 2
    assert summary["samples"] == 18 and summary["failed_samples"] == 4 and summary["correct_samples"] == 6
    assert summary["wrong_samples"] == 8 and summary["unparseable_samples"] == 4  # '#### 4.' is 4; '4' has no ####
    assert counts.unaccounted() == 0 and set(summary["no_pair"]) <= set(NO_PAIR_REASONS)
    pairs = read_jsonl(out / "data.jsonl")
    assert len(pairs) == summary["pairs"]
    assert {p["prompt"] for p in pairs} == {"Question: A\nAnswer:", "Question: F\nAnswer:"}
    for pair in pairs:
        reference = "4"
        assert STRICT.is_correct(pair["chosen"], reference) and not STRICT.is_correct(pair["rejected"], reference)
    no_pair = read_jsonl(out / "no_pair.jsonl")
    assert len(no_pair) == sum(summary["no_pair"].values())
    failed = next(r for r in no_pair if r["reason"] == "generation_failed")
    assert "HTTP 500" in failed["detail"] and failed["samples"] == ["", "", ""]


def test_samples_of_a_problem_are_regrouped_from_any_batches() -> None:
    rows = [{"problem_id": p, "samples": 2, "sample": i} for p, i in (("a", 0), ("b", 0), ("b", 1), ("a", 1))]
    batches = [pa.Table.from_pylist(rows[:2]), pa.Table.from_pylist(rows[2:3]), pa.Table.from_pylist(rows[3:])]
    groups = list(complete_seed_batches(batches, key="problem_id", size="samples"))
    assert [sorted((r["problem_id"], r["sample"]) for r in g) for g in groups] == [[("b", 0), ("b", 1)],
                                                                                   [("a", 0), ("a", 1)]]  # fmt: skip
    with pytest.raises(DataError, match="'problem_id' lost rows"):
        list(complete_seed_batches(batches[:1], key="problem_id", size="samples"))


def test_the_samples_are_cut_into_blocks_of_one_generate_batch_each() -> None:
    problems = [problem_row(f"What is {i}?", str(i), f"#### {i}", PairsConfig()) for i in range(5)]
    blocks = sample_blocks(problems, 4, 8)
    assert [len(block) for block in blocks] == [8, 8, 4]
    rows = [(row["problem_id"], row["sample"]) for block in blocks for row in block]
    assert rows == [(p["problem_id"], sample) for p in problems for sample in range(4)]
    assert [len(block) for block in sample_blocks(problems, 4, 3)] == [3] * 6 + [2]


def test_the_pairs_section_is_checked_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match="samples_per_problem"):
        load_config(None, ["pairs.samples_per_problem=1"])
    with pytest.raises(ConfigError, match="pairs.answer_match"):
        load_config(None, ["pairs.answer_match=loose"])


def test_the_cli_refuses_a_missing_model_before_anything_starts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rayft.cli.main import cli

    config = Path(__file__).resolve().parents[2] / "configs" / "gsm8k-dpo.yaml"
    args = ["pairs", str(config), f"storage_path={tmp_path}", "--model", str(tmp_path / "missing"), "-k", "3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Error: model source '{tmp_path / 'missing'}' does not exist" in result.output
    assert not (tmp_path / "gsm8k-dpo" / "pairs").exists()
