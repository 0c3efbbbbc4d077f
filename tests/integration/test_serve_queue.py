"""`rayft serve` when Ray Serve's own queue is full: with one request in flight allowed and one held in Serve's
queue, one more is answered 503 with Retry-After at once, by the router in OpenAI's error shape, not left
waiting; the queued one is served later."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import rayft
from rayft import api
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(ray_session: None, tiny_model_dir: Path) -> Iterator[rayft.ServeHandle]:
    serve = {"max_ongoing_requests": 1, "max_batch_size": 1, "max_queued_requests": 1, "serve_queue_requests": 1,
             "serve_retry_after_s": 3, "max_tokens": 8}  # fmt: skip
    with api.serve(RayftConfig.model_validate({"serve": serve}), [str(tiny_model_dir)], port=0) as handle:
        yield handle


def _short(server: rayft.ServeHandle) -> httpx.Response:
    body = {"model": server.model_ids[0], "prompt": "SELECT", "max_tokens": 3, "temperature": 0}
    return httpx.post(f"{server.base_url}/completions", json=body, timeout=120)


def test_one_request_beyond_serves_queue_is_503_at_once(server: rayft.ServeHandle) -> None:
    answers: queue.Queue[httpx.Response] = queue.Queue()
    body = {"model": server.model_ids[0], "prompt": "The quick brown fox", "max_tokens": 2000, "temperature": 0,
            "stream": True}  # fmt: skip
    with contextlib.ExitStack() as stack:
        long = stack.enter_context(httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=120))
        lines = long.iter_lines()  # kept: a dropped line iterator closes its stream
        assert long.status_code == 200 and next(lines).startswith("data: ")  # it holds the one slot
        senders = [threading.Thread(target=lambda: answers.put(_short(server))) for _ in range(2)]
        for sender in senders:
            sender.start()
        refused = answers.get(timeout=60)  # while the long stream still runs: one waits in Serve's queue
        assert answers.empty() and lines
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "3"
        assert refused.json()["error"]["code"] == "server_busy", refused.text  # the router's, not Serve's proxy's
    for sender in senders:  # the long stream closed: the queued request gets the slot
        sender.join(timeout=120)
    served = answers.get(timeout=1)
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3


def test_requests_that_arrive_together_are_refused_by_the_router_in_openais_shape(
    server: rayft.ServeHandle,
) -> None:
    # Serve's proxy counts requests that arrive together as queued until each reaches the router; with a
    # queue as small as the models' it refused some itself, in plain text, while the router had room.
    body = {"model": server.model_ids[0], "prompt": "The quick brown fox", "max_tokens": 2000, "temperature": 0,
            "stream": True}  # fmt: skip
    refusals: list[httpx.Response] = []
    for _ in range(8):
        answers: queue.Queue[httpx.Response] = queue.Queue()
        together = threading.Barrier(3)

        def send(together: threading.Barrier = together, answers: queue.Queue[httpx.Response] = answers) -> None:
            together.wait()
            answers.put(_short(server))

        with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=120) as long:
            lines = long.iter_lines()
            assert long.status_code == 200 and next(lines).startswith("data: ")  # it holds the one slot
            senders = [threading.Thread(target=send) for _ in range(3)]
            for sender in senders:
                sender.start()
            # One waits in Serve's queue for the model until the long stream closes; two are refused at once.
            refusals += [answers.get(timeout=60), answers.get(timeout=60)]
        for sender in senders:
            sender.join(timeout=120)
        assert answers.get(timeout=1).status_code == 200
    assert all(r.status_code == 503 and r.json()["error"]["code"] == "server_busy" for r in refusals), [
        r.text for r in refusals
    ]
