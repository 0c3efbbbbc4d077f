"""The router's drain (rayft.serving.drain), on async streams standing in for the replicas' event streams: new
requests refused in OpenAI's shape with a Retry-After, the requests in flight let finish, and a stream that
outlasts the drain cut with an error of its own, never cut without a word."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rayft.serving.drain import CUT_WAIT_S, Drain, StreamCutError
from rayft.serving.rows import Finished


class Replica:
    """A replica's response stream: ``tokens`` events released one by one by the test, then Finished."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.release, self.cancelled = tokens, asyncio.Semaphore(0), False
        self._events = self._run()

    async def _run(self) -> AsyncIterator[Any]:
        for index in range(self.tokens):
            await self.release.acquire()
            yield f"t{index}"
        yield Finished("stop", self.tokens)

    def __aiter__(self) -> Replica:
        return self

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    def cancel(self) -> None:
        self.cancelled = True


async def _read(stream: Any) -> list[Any]:
    events: list[Any] = []
    try:
        async for event in stream:
            events.append(event)
    except StreamCutError as cut:
        events.append(cut.error.body())
    return events


def test_nothing_in_flight_drains_at_once_and_refuses_what_comes_after() -> None:
    async def scenario() -> None:
        drain = Drain()
        assert drain.refusal() is None
        assert await asyncio.wait_for(drain.run(30.0), 1.0) == 0
        refusal = drain.refusal()
        assert refusal is not None and refusal.status == 503 and 29 <= refusal.retry_after_s <= 30
        body = refusal.body()["error"]
        assert (body["type"], body["code"]) == ("service_unavailable_error", "server_shutting_down")
        assert "shutting down and takes no new requests; retry after" in body["message"]

    asyncio.run(scenario())


def test_a_stream_in_flight_finishes_within_the_drain() -> None:
    async def scenario() -> None:
        drain, replica = Drain(), Replica(tokens=3)
        reading = asyncio.ensure_future(_read(drain.watch(replica)))
        draining = asyncio.ensure_future(drain.run(30.0))
        for _ in range(3):
            replica.release.release()
        events = await reading
        assert events == ["t0", "t1", "t2", Finished("stop", 3)]
        assert await asyncio.wait_for(draining, 1.0) == 0 and drain.in_flight == 0

    asyncio.run(scenario())


def test_a_stream_longer_than_the_drain_ends_with_an_error_event() -> None:
    async def scenario() -> None:
        drain, replica = Drain(), Replica(tokens=100)
        reading = asyncio.ensure_future(_read(drain.watch(replica)))
        replica.release.release()  # one token, then the replica holds the rest past the drain
        draining = asyncio.ensure_future(drain.run(0.2))
        events = await asyncio.wait_for(reading, 5.0)
        assert events[0] == "t0" and Finished not in map(type, events)
        last = events[-1]["error"]
        assert last["code"] == "server_shutting_down"
        assert "shut down before this response finished (serve.graceful_shutdown_timeout_s = 0.2 s" in last["message"]
        assert await asyncio.wait_for(draining, CUT_WAIT_S) == 1 and drain.in_flight == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("end", ["cancelled", "failed"])
def test_a_stream_that_ends_otherwise_no_longer_holds_the_drain(end: str) -> None:
    async def scenario() -> None:
        drain = Drain()

        async def failing() -> AsyncIterator[Any]:
            raise RuntimeError("the replica died")
            yield  # an async generator

        replica = Replica(tokens=5)
        watched = drain.watch(replica if end == "cancelled" else failing())
        if end == "cancelled":
            watched.cancel()
            assert replica.cancelled
        else:
            with pytest.raises(RuntimeError):
                await watched.__anext__()
        assert drain.in_flight == 0 and await asyncio.wait_for(drain.run(30.0), 1.0) == 0

    asyncio.run(scenario())
