"""The pair maker for real on Ray Data: k samples per problem from the tiny model (HF generate), and
from an OpenAI-compatible server whose answers are known, so that every reason a problem gives no
pair shows up; the files agree with the counts, and the counts add up."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.integration


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_problems(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in rows))
    return path


def assert_counts_add_up(result: Any, num_problems: int, k: int) -> dict[str, Any]:
    """The summary's counts against each other and against the files written."""
    summary = json.loads(result.summary_json.read_text())
    assert summary == result.summary
    assert summary["problems"] == num_problems
    assert summary["problems_with_pairs"] + sum(summary["no_pair"].values()) == num_problems
    assert summary["correct_samples"] + summary["wrong_samples"] + summary["failed_samples"] == summary["samples"]
    pairs, no_pair = read_jsonl(result.data_jsonl), read_jsonl(result.no_pair_jsonl)
    assert len(pairs) == summary["pairs"] and len({p["problem_id"] for p in pairs}) == summary["problems_with_pairs"]
    assert Counter(r["reason"] for r in no_pair) == summary["no_pair"]
    screened = summary["no_pair"].get("eval_overlap", 0) + summary["no_pair"].get("bad_reference", 0)
    sampled = summary["problems"] - screened
    assert summary["samples"] == sampled * k
    assert not list(result.output_dir.glob(".*"))  # no temporary file left behind
    return summary


def test_the_tiny_model_samples_every_problem_and_every_problem_is_accounted_for(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.recipes.pairs import run

    rows = [(f"What is {i} plus 0?", f"{i} + 0 = {i}\n#### {i}") for i in range(5)]
    problems = write_problems(tmp_path / "p.jsonl", rows)
    cfg = load_config(None, [
        f"storage_path={tmp_path}", f"pairs.problems.path={problems}", "pairs.samples_per_problem=3",
        "pairs.answer_match=flexible", "pairs.generation.max_new_tokens=6", "pairs.generation.batch_size=8",
    ])  # fmt: skip
    result = run(cfg, model=str(tiny_model_dir))
    summary = assert_counts_add_up(result, num_problems=5, k=3)
    assert summary["failed_samples"] == 0 and summary["model"] == str(tiny_model_dir)
    for row in read_jsonl(result.no_pair_jsonl):
        assert len(row["samples"]) == 3
        assert row["reason"] in ("no_correct_sample", "no_parseable_sample", "no_wrong_sample")
    assert result.output_dir == tmp_path / "rayft-run" / "pairs"


class KnownAnswers:
    """A sampler whose answers are set per question: 'mixed' alternates right and wrong, 'right' and
    'wrong' always are, 'words' never gives a number."""

    def __init__(self, plans: dict[str, str]) -> None:
        self.plans = plans
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> str:
        text = request["messages"][-1]["content"]
        question = re.search(r"Question: (.*)\nAnswer:", text).group(1)  # type: ignore[union-attr]
        with self.lock:
            self.calls[question] += 1
            call = self.calls[question]
        right = int(re.findall(r"\d+", question)[0]) * 2
        plan = self.plans[question]
        if plan == "words":
            return "I am not sure."
        correct = plan == "right" or (plan == "mixed" and call % 2 == 1)
        answer = right if correct else right + 1
        return f"Attempt {call}: twice is {answer}.\n#### {answer}"  # each attempt's text differs


def test_pairs_hold_a_verified_right_answer_over_a_wrong_one_and_say_why_others_gave_none(
    ray_session: None, tmp_path: Path
) -> None:
    from rayft.recipes.pairs import run

    plans = {"What is twice 3?": "mixed", "What is twice 4?": "mixed", "What is twice 5?": "right",
             "What is twice 6?": "wrong", "What is twice 7?": "words"}  # fmt: skip
    rows = [(q, f"#### {int(q.split()[-1][:-1]) * 2}") for q in plans]
    rows += [("What is twice 8?", "sixteen"), ("Tom has 9 red apples and gives 2 red apples to his sister", "#### 7")]
    problems = write_problems(tmp_path / "p.jsonl", rows)
    test_problem = ("Tom has 4 red apples and gives 1 red apples to his sister", "")
    leaked = write_problems(tmp_path / "test.jsonl", [test_problem])
    sampler = KnownAnswers(plans)
    with OpenAIServer(responder=sampler) as server:
        cfg = load_config(None, [
            f"storage_path={tmp_path}", f"pairs.problems.path={problems}", "pairs.samples_per_problem=4",
            "pairs.max_pairs_per_problem=2", "pairs.generation.backend=openai",
            f"pairs.generation.endpoint.base_url={server.base_url}", "pairs.generation.endpoint.max_retries=0",
            f"pairs.decontamination.datasets=[{{path: {leaked}}}]", "pairs.decontamination.ngram_words=5",
        ])  # fmt: skip
        result = run(cfg, model="known-answers", output_dir=tmp_path / "out")
    summary = assert_counts_add_up(result, num_problems=7, k=4)
    assert summary["no_pair"] == {"bad_reference": 1, "eval_overlap": 1, "no_correct_sample": 1,
                                  "no_parseable_sample": 1, "no_wrong_sample": 1}  # fmt: skip
    assert summary["pairs"] == 4 and summary["correct_samples"] == 4 + 4 and summary["unparseable_samples"] == 4
    for pair in read_jsonl(result.data_jsonl):
        right = int(re.findall(r"\d+", pair["prompt"])[0]) * 2
        assert pair["chosen"].endswith(f"#### {right}") and pair["rejected"].endswith(f"#### {right + 1}")
        assert pair["prompt"].startswith("Question: What is twice")
    assert sum(sampler.calls.values()) == 5 * 4  # the screened problems were never sampled


def test_samples_come_back_one_generate_batch_at_a_time(ray_session: None, tiny_model_dir: Path) -> None:
    """Each generate batch's samples are streamed back as soon as it is generated, not when every batch
    of a larger block is, so that finished problems are written (and counted) as the batches come and
    the actors share the work batch by batch."""
    from rayft.models.sources import ResolvedSource
    from rayft.sdg.pair_maker import build_dataset
    from rayft.sdg.pair_plan import plan_pairs, problem_row

    cfg = load_config(None, ["pairs.samples_per_problem=4", "pairs.generation.max_new_tokens=2",
                             "pairs.generation.batch_size=8", "pairs.generation.concurrency=2"])  # fmt: skip
    model = cfg.model.model_copy(update={"name": str(tiny_model_dir)})
    plan = plan_pairs(cfg.pairs, ResolvedSource(str(tiny_model_dir), "model", model), default_seed=0)
    problems = [problem_row(f"What is {i} plus 0?", str(i), f"#### {i}", cfg.pairs) for i in range(8)]
    blocks = list(build_dataset(problems, plan).iter_batches(batch_size=None, batch_format="pyarrow"))
    assert sum(block.num_rows for block in blocks) == 8 * 4
    assert [block.num_rows for block in blocks] == [8, 8, 8, 8]
