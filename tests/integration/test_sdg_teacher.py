"""The LLM teacher path of `rayft sdg`: HF generate on the tiny model, and an OpenAI-compatible
server (a real local HTTP server) with injected failures, through the Ray Data actor pool."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from rayft.config import load_config
from rayft.sdg.mathcheck import check_math_answer
from rayft.sdg.symbolic import UnusableSeedError, analyze_seed, make_variation
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.integration


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_hf_teacher_on_the_tiny_model_accounts_for_every_row(
    ray_session: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rayft.recipes.sdg import run

    cfg = load_config(
        None,
        [
            f"storage_path={tmp_path}",
            "sdg.generator=llm",
            f"sdg.teacher.model.name={tiny_model_dir}",
            "sdg.teacher.max_new_tokens=6",
            "sdg.teacher.batch_size=4",
            "sdg.num_seeds=3",
            "sdg.variations=2",
        ],
    )
    result = run(cfg)
    rows = read_jsonl(result.data_jsonl) + read_jsonl(result.rejected_jsonl)
    assert len(rows) == 6 and len({r["id"] for r in rows}) == 6
    # A random-init model writes no parsable problem: every row is rejected with its reason, none lost.
    for row in rows:
        assert row["model"] == f"hf:{tiny_model_dir}" and row["generator"] == "llm"
        assert row["seed_question"] in json.loads(row["prompt"])[-1]["content"]
        assert json.loads(row["sampling"])["max_new_tokens"] == 6
        assert row["reject_stage"] in ("parse", "quality") or not row["reject_reason"]
    assert 0 < result.summary["tokens_generated"] <= 36
    assert result.summary["stage_seconds"]["generate"] > 0


def variation_responder(request: dict[str, Any]) -> str:
    """A deterministic 'teacher': a symbolic variation of the seed found in the prompt.

    Asked to solve a problem (self-consistency), it answers right for questions of even length and
    wrong otherwise; asked to judge, it gives 9, except 2 to questions whose length is a multiple of 3.
    """
    prompt = request["messages"][-1]["content"]
    if prompt.startswith("Solve this"):
        question = prompt.split("Problem: ", 1)[1]
        right = FINALS[question]
        return f"Let me see.\n#### {right if len(question) % 2 == 0 else right + 1}"
    if prompt.startswith("Rate the following"):
        question = prompt.split("Problem: ", 1)[1].split("\n\nSolution:", 1)[0]
        return "Score: 2" if len(question) % 3 == 0 else "Score: 9"
    match = re.search(r"Problem: (.*?)\n\nSolution:\n(.*?)\n\nWrite one NEW", prompt, re.S)
    assert match, prompt
    try:
        chain = analyze_seed(match.group(1), match.group(2))
    except UnusableSeedError:
        return "I cannot write one."
    made = make_variation(chain, random.Random(len(prompt) + len(FINALS)))
    if made is None:
        return "I cannot write one."
    FINALS[made[0]] = int(made[1].rsplit("#### ", 1)[1])
    return f"Problem: {made[0]}\nSolution:\n{made[1]}"


FINALS: dict[str, int] = {}


def openai_teacher(tmp_path: Path, server: OpenAIServer) -> list[str]:
    """Overrides of an sdg run whose teacher is ``server``: one request at a time, one quick retry."""
    return [
        f"storage_path={tmp_path}",
        "sdg.generator=llm",
        "sdg.teacher.backend=openai",
        "sdg.teacher.model.name=teacher-1",
        f"sdg.teacher.endpoint.base_url={server.base_url}",
        "sdg.teacher.endpoint.max_retries=1",
        "sdg.teacher.endpoint.backoff_s=0.01",
        "sdg.teacher.endpoint.max_concurrency=1",
    ]


def test_openai_teacher_with_retries_and_a_failed_request(ray_session: None, tmp_path: Path) -> None:
    from rayft.recipes.sdg import run

    with OpenAIServer(responder=variation_responder) as server:
        server.fail_next(503, times=2)  # the first request fails twice: with 1 retry it gives up
        server.fail_next(429, times=1, retry_after_s=0.05)  # the second succeeds on its retry
        cfg = load_config(
            None,
            [
                *openai_teacher(tmp_path, server),
                "sdg.teacher.batch_size=8",
                "sdg.num_seeds=4",
                "sdg.variations=2",
                "sdg.dedup.near=false",
                "sdg.quality.self_consistency=2",
                "sdg.quality.judge=true",
            ],
        )
        result = run(cfg)
    accepted, rejected = read_jsonl(result.data_jsonl), read_jsonl(result.rejected_jsonl)
    assert len(accepted) + len(rejected) == 8
    failed = [r for r in rejected if r["reject_reason"] == "generation_error"]
    assert len(failed) == 1 and "HTTP 503" in failed[0]["error"] and failed[0]["question"] == ""
    assert server.statuses[:4] == [503, 503, 429, 200]
    assert accepted, result.summary
    for row in accepted:
        assert check_math_answer(row["answer"]) is None
        assert row["model"].startswith("openai:teacher-1@") and row["error"] == ""
        assert len(row["question"]) % 2 == 0 and len(row["question"]) % 3 != 0
    checked = [r for r in rejected if r["reject_stage"] == "teacher_checks"]
    assert {r["reject_reason"] for r in checked} == {"self_consistency", "judge_low_score"}
    for row in checked:
        odd = len(row["question"]) % 2 == 1
        assert row["reject_reason"] == ("self_consistency" if odd else "judge_low_score"), row
    assert result.summary["rejection_reasons"]["generate/generation_error"] == 1
    assert result.summary["tokens_generated"] > 0


def test_a_teacher_that_fails_every_request_stops_the_run_and_a_rerun_goes_on(
    ray_session: None, tmp_path: Path
) -> None:
    from rayft.errors import EndpointError
    from rayft.recipes.sdg import run

    with OpenAIServer(responder=variation_responder) as server:
        server.fail_next(503, times=8)  # every request of the first run (4 rows), each tried twice
        cfg = load_config(
            None,
            [
                *openai_teacher(tmp_path, server),
                "sdg.teacher.batch_size=2",
                "sdg.seeds_per_batch=1",
                "sdg.num_seeds=2",
                "sdg.variations=2",
                "sdg.dedup.near=false",
            ],
        )
        with pytest.raises(EndpointError, match=r"all \d teacher requests of the first batch failed \(first: .*503"):
            run(cfg)
        failed_run = len(server.statuses)
        server.clear_failures()
        result = run(cfg)  # the teacher answers now: the same command goes on, nothing was marked done
    rows = read_jsonl(result.data_jsonl) + read_jsonl(result.rejected_jsonl)
    assert len(rows) == 4 and not [r for r in rows if r["reject_reason"] == "generation_error"]
    assert failed_run >= 4 and set(server.statuses[:failed_run]) == {503}
    assert set(server.statuses[failed_run:]) == {200}


@pytest.mark.slow
def test_smollm2_teacher_end_to_end(ray_session: None, tmp_path: Path) -> None:
    from rayft.recipes.sdg import run

    cfg = load_config(
        None,
        [
            f"storage_path={tmp_path}",
            "sdg.generator=llm",
            "sdg.teacher.model.name=smollm2-135m-instruct",
            "sdg.teacher.max_new_tokens=160",
            "sdg.num_seeds=2",
            "sdg.variations=2",
        ],
    )
    result = run(cfg)
    rows = read_jsonl(result.data_jsonl) + read_jsonl(result.rejected_jsonl)
    assert len(rows) == 4 and result.summary["tokens_generated"] > 0
    for row in read_jsonl(result.data_jsonl):
        assert check_math_answer(row["answer"]) is None
