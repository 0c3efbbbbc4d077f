"""The LLM judge reward against a real `rayft serve` of the tiny random-init model, with an API key: every
judgement is a real chat completion, and the random model's replies (no 'SCORE: <number>') are counted as
unparsable and score the fallback, while the run of rewards goes on; a second scoring comes from the cache."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import rayft
from rayft import api
from rayft.config import RayftConfig
from rayft.config.judge import JudgeConfig
from rayft.config.rl import RewardConfig
from rayft.evaluation.judge import LLMJudge
from rayft.evaluation.rewards import BatchReward, RewardSet

pytestmark = pytest.mark.integration

KEY = "sk-rayft-" + "Jd7pQ2wLx9Rc4Vb8Nm1Tk6Ye"
KEY_ENV = "RAYFT_TEST_JUDGE_KEY"


@pytest.fixture(scope="module")
def server(
    ray_session: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[rayft.ServeHandle]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"{KEY}\n", encoding="utf-8")
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8, "api_keys_file": str(keys)}})
    with api.serve(cfg, [str(tiny_model_dir)], port=0) as handle:
        yield handle


def test_a_served_judge_answers_and_its_garbage_is_counted(
    server: rayft.ServeHandle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level(logging.DEBUG)
    judge = JudgeConfig(
        model=server.model_ids[0],
        endpoint={"base_url": server.base_url, "api_key_env": KEY_ENV, "timeout_s": 60, "max_concurrency": 4},
        prompt_column="question",
        max_new_tokens=8,
        fallback=0.5,
    )
    rewards = RewardSet.build([RewardConfig(function="judge", judge=judge)], max_new_tokens=16)
    rows = [{"question": f"What is {n} + {n}?"} for n in range(6)]
    completions = [str(2 * n) for n in range(6)]
    scores = rewards.score(completions, completions, rows)
    fn = rewards.functions[0].fn
    assert isinstance(fn, BatchReward) and isinstance(fn.one, LLMJudge)
    counts = fn.one.counts
    # every judgement was answered (no failure); whatever the random model said, it was read strictly: a reply
    # that parsed scores in [0, 1], one that did not scores the fallback and is counted
    assert counts.requests == 6 and counts.failed == 0
    assert scores.errors == {"judge": counts.unparsable}
    assert all(0.0 <= value <= 1.0 for value in scores.by_function["judge"])
    assert scores.by_function["judge"].count(0.5) >= counts.unparsable
    assert counts.unparsable > 0  # a random-weights model does not write 'SCORE: <number>'
    unparsable = counts.unparsable
    again = rewards.score(completions, completions, rows)
    assert counts.requests == 6 + unparsable  # the parsed ones came from the cache, failures were asked again
    assert counts.cache_hits == 6 - unparsable
    assert again.errors == scores.errors  # greedy: the same garbage
    assert KEY not in caplog.text
