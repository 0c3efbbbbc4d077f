"""The LLM judge reward against a real local HTTP server: scores parsed strictly, cached, batched under a
bound, and a judge that answers garbage, hangs past the timeout or fails with 500 costs samples, not the run."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import ValidationError

from rayft.config.judge import JudgeConfig
from rayft.config.rl import RewardConfig
from rayft.evaluation.judge import LLMJudge, parse_score
from rayft.evaluation.rewards import RewardSet

KEY = "sk-judge-secret-4f9a2c"


class Judge:
    """The server's state: requests seen per mode, concurrency, the release of hanging requests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.auth: list[str] = []
        self.release = threading.Event()


def handler(state: Judge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep the test output quiet
            pass

        def do_POST(self) -> None:
            mode = self.path.split("/")[1]
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests[mode] = state.requests.get(mode, 0) + 1
                seen = state.requests[mode]
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                state.auth.append(self.headers.get("Authorization", ""))
            try:
                self.answer(mode, seen, body["messages"][0]["content"])
            finally:
                with state.lock:
                    state.in_flight -= 1

        def answer(self, mode: str, seen: int, rubric: str) -> None:
            if mode == "hang":
                state.release.wait(30)  # past the client's timeout; released when the test ends
                return
            if mode == "flaky" and seen == 1:
                self.send(500, {"error": "busy"})
                return
            # the completion under judgement is the answer "n" for some digit n: it scores n
            text = "I cannot judge that." if mode == "garbage" else f"Looks fine.\nSCORE: {rubric.split('<<')[1][0]}"
            self.send(200, {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

        def send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Judge]]:
    state = Judge()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join()


RUBRIC = "Task: {prompt}\nReference: {reference}\nAnswer: <<{completion}>>\nScore {score_min} to {score_max}."


def judge_config(url: str, mode: str, **overrides: Any) -> dict[str, Any]:
    endpoint = {"base_url": f"{url}/{mode}/v1", "api_key_env": "RAYFT_TEST_JUDGE_KEY", "timeout_s": 5.0,
                "max_retries": 0, "backoff_s": 0.0, **overrides.pop("endpoint", {})}  # fmt: skip
    return {"model": "judge", "endpoint": endpoint, "rubric": RUBRIC, "prompt_column": "question", **overrides}


def reward_set(url: str, mode: str, **overrides: Any) -> RewardSet:
    cfg = RewardConfig(function="judge", judge=JudgeConfig(**judge_config(url, mode, **overrides)))
    return RewardSet.build([cfg], max_new_tokens=16)


ROWS = [{"question": f"q{i}"} for i in range(4)]


def test_parse_score_reads_the_last_score_in_range_strictly() -> None:
    assert parse_score("SCORE: 3\nno, SCORE: 7.5", 0, 10) == 0.75
    assert parse_score("SCORE: -1", -1, 1) == 0.0
    for reply in ("score: 7", "SCORE: seven", "SCORE: 11", "The answer scores 7", "SCORE: 7.5.1"):
        with pytest.raises(ValueError):
            parse_score(reply, 0, 10)


def test_judge_scores_sends_the_key_and_never_logs_it(
    server: tuple[str, Judge], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url, state = server
    monkeypatch.setenv("RAYFT_TEST_JUDGE_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    scores = reward_set(url, "score").score(["2", "5", "10", "0"], ["r"] * 4, ROWS)
    # the server scores "10" by its first digit, 1; parse_score divides n by 10 as written here, so equality holds
    assert scores.by_function["judge"] == [2 / 10, 5 / 10, 1 / 10, 0 / 10]
    assert scores.errors == {"judge": 0}
    assert state.auth == [f"Bearer {KEY}"] * 4
    assert KEY not in caplog.text


def test_judgements_are_cached_and_bounded(server: tuple[str, Judge]) -> None:
    url, state = server
    judge = LLMJudge(JudgeConfig(**judge_config(url, "score", cache_size=2)))
    assert judge.many(["1", "2", "1"], ["r"] * 3, ROWS[:1] * 3) == [0.1, 0.2, 0.1]
    assert state.requests["score"] == 2  # the repeated completion is judged once
    assert judge.many(["2", "1"], ["r"] * 2, ROWS[:1] * 2) == [0.2, 0.1]
    assert state.requests["score"] == 2 and judge.counts.cache_hits == 2
    judge.many(["3"], ["r"], ROWS[:1])  # a third distinct judgement drops the least recently used ("2")
    assert len(judge.cache) == 2
    judge.many(["2"], ["r"], ROWS[:1])
    assert state.requests["score"] == 4
    judge.close()


def test_concurrent_requests_stay_within_the_bound(server: tuple[str, Judge]) -> None:
    url, state = server
    judge = LLMJudge(JudgeConfig(**judge_config(url, "score", endpoint={"max_concurrency": 2})))
    judge.many([str(i) for i in range(10)], ["r"] * 10, [{"question": "q"}] * 10)
    assert state.requests["score"] == 10 and 1 <= state.max_in_flight <= 2


def test_garbage_is_counted_and_scores_the_fallback(server: tuple[str, Judge]) -> None:
    url, _ = server
    scores = reward_set(url, "garbage", fallback=0.25).score(["1", "2"], ["r"] * 2, ROWS[:2])
    assert scores.by_function["judge"] == [0.25, 0.25]
    assert scores.errors == {"judge": 2}
    assert scores.total == [0.25, 0.25]


def test_a_judge_that_hangs_times_out_and_is_counted(server: tuple[str, Judge]) -> None:
    url, state = server
    rewards = reward_set(url, "hang", endpoint={"timeout_s": 0.3, "max_retries": 1})
    scores = rewards.score(["1", "2"], ["r"] * 2, ROWS[:2])
    assert scores.by_function["judge"] == [0.0, 0.0] and scores.errors == {"judge": 2}
    assert state.requests["hang"] == 4  # each judgement tried twice: the retry after a timeout


def test_a_500_is_retried_then_scores(server: tuple[str, Judge]) -> None:
    url, state = server
    scores = reward_set(url, "flaky", endpoint={"max_retries": 2}).score(["4"], ["r"], ROWS[:1])
    assert scores.by_function["judge"] == [0.4] and scores.errors == {"judge": 0}
    assert state.requests["flaky"] == 2


def test_a_row_without_the_prompt_column_is_counted(server: tuple[str, Judge]) -> None:
    url, _ = server
    scores = reward_set(url, "score").score(["1"], ["r"], [{"other": "x"}])
    assert scores.errors == {"judge": 1}


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ({"function": "judge"}, "needs a judge section"),
        ({"function": "math", "judge": {"model": "m"}}, "only 'judge' reads one"),
        ({"function": "judge", "judge": {"model": "m", "rubric": "{answer}"}}, "unknown placeholders"),
        ({"function": "judge", "judge": {"model": "m", "rubric": "{prompt}"}}, "no {completion}"),
        ({"function": "judge", "judge": {"model": "m", "score_max": 0}}, "not above score_min"),
        ({"function": "judge", "judge": {"model": "m", "rubric": "{completion"}}, "not a valid format"),
    ],
)
def test_bad_judge_configs_are_refused(reward: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("{", r"\{")):
        RewardConfig(**reward)


def test_the_prompt_column_is_carried() -> None:
    cfg = RewardConfig(function="judge", judge=JudgeConfig(model="m", prompt_column="question"))
    assert cfg.columns == ("question",)
