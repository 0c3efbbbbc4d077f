"""Continuous batching in `rayft serve` on the shared local Ray: a short request joins the batch of a long
one that streams and ends first; a client that leaves frees its row; a full queue answers 429 with Retry-After; a
request that shares its prompt's start with an earlier one prefills only the rest (the prompt-prefix cache).

The replica decodes 2 rows at a time, queues 1 more request and caches 256 tokens of prompt prefixes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration

LONG = {"prompt": "The quick brown fox", "max_tokens": 2000, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def server(ray_session: None, tiny_model_dir: Path) -> Iterator[rayft.ServeHandle]:
    serve = {"max_batch_size": 2, "max_queued_requests": 1, "max_ongoing_requests": 8, "max_tokens": 8,
             "prefix_cache_tokens": 256}  # fmt: skip
    handle = rayft.api.serve(RayftConfig.model_validate({"serve": serve}), [tiny_model_dir], port=0)
    yield handle
    handle.shutdown()


def _stats(server: rayft.ServeHandle) -> dict[str, Any]:
    url = server.base_url.removesuffix("/v1") + "/rayft/stats"
    deployments: list[dict[str, Any]] = httpx.get(url, timeout=60).json()["deployments"]
    return deployments[0]


def _wait_for(server: rayft.ServeHandle, what: str, value: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (stats := _stats(server))[what] != value:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    return stats


def _open_long(server: rayft.ServeHandle, stack: contextlib.ExitStack) -> Iterator[str]:
    """A long streamed completion, once its first piece of text has arrived (so its row decodes)."""
    body = {"model": server.model_ids[0], **LONG}
    response = stack.enter_context(httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=120))
    assert response.status_code == 200
    lines = response.iter_lines()
    assert next(lines).startswith("data: ")
    return lines


def _short(server: rayft.ServeHandle) -> httpx.Response:
    body = {"model": server.model_ids[0], "prompt": "SELECT", "max_tokens": 3, "temperature": 0}
    return httpx.post(f"{server.base_url}/completions", json=body, timeout=120)


def test_a_short_request_finishes_while_a_long_one_streams(server: rayft.ServeHandle) -> None:
    before = _stats(server)
    chunks: list[str] = []
    seen_when_short_ended: list[int] = []
    with contextlib.ExitStack() as stack:
        lines = _open_long(server, stack)
        reader = threading.Thread(target=lambda: chunks.extend(line for line in lines if line))
        reader.start()
        short = _short(server)
        seen_when_short_ended.append(len(chunks))
        reader.join(timeout=120)
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 3
    assert chunks[-1] == "data: [DONE]" and '"finish_reason":"length"' in chunks[-2]
    # The short request joined the running batch and ended before a fifth of the long one had streamed.
    assert seen_when_short_ended[0] < len(chunks) / 5, (seen_when_short_ended, len(chunks))
    assert _stats(server)["joined_running_batch"] == before["joined_running_batch"] + 1


def test_a_client_that_leaves_frees_its_row(server: rayft.ServeHandle) -> None:
    before = _stats(server)
    with contextlib.ExitStack() as stack:
        _open_long(server, stack)
    assert _wait_for(server, "rows_in_flight", 0)["cancelled"] == before["cancelled"] + 1


def test_a_full_queue_answers_429_with_retry_after(server: rayft.ServeHandle) -> None:
    queued: list[httpx.Response] = []
    with contextlib.ExitStack() as stack:
        streams = [_open_long(server, stack) for _ in range(2)]  # kept: a dropped line iterator closes its stream
        waiting = threading.Thread(target=lambda: queued.append(_short(server)))
        waiting.start()
        _wait_for(server, "waiting", 1)
        refused = _short(server)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "serve.max_queued_requests" in error["message"]
        assert _stats(server)["rows_in_flight"] == len(streams)
    waiting.join(timeout=120)  # the two long streams closed: the queued request gets a row
    assert queued and queued[0].status_code == 200 and queued[0].json()["usage"]["completion_tokens"] == 3
    assert _wait_for(server, "rows_in_flight", 0)["refused"] >= 1


def test_a_shared_prompt_prefix_is_prefilled_once_and_its_hit_rate_shown(server: rayft.ServeHandle) -> None:
    system = "You are a careful assistant. Answer briefly and show the steps of any arithmetic. " * 2  # 94 tokens
    before = _stats(server)
    answers = []
    for turn in ("Question: what is 2 + 3?", "Question: name a prime number."):
        body = {"model": server.model_ids[0], "prompt": system + turn, "max_tokens": 4, "temperature": 0}
        answers.append(httpx.post(f"{server.base_url}/completions", json=body, timeout=120))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    after = _stats(server)
    prompt_tokens = sum(a.json()["usage"]["prompt_tokens"] for a in answers)
    hits = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    # The second prompt found the first's full blocks of the shared system prompt (80 of its 94 tokens at least).
    assert after["prefix_hit_requests"] - before["prefix_hit_requests"] == 1 and hits >= 80
    assert after["prefix_queried_tokens"] - before["prefix_queried_tokens"] == prompt_tokens
    assert after["prefill_tokens"] - before["prefill_tokens"] == prompt_tokens - hits
    metrics = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=60).text
    ratio = next(line for line in metrics.splitlines() if line.startswith("rayft_serve_prefix_cache_hit_ratio{"))
    assert float(ratio.rsplit(" ", 1)[1]) == pytest.approx(after["prefix_hit_tokens"] / after["prefix_queried_tokens"])
