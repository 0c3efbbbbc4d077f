"""How the ``rayft serve`` router stops: a drain with answers, and streams that end with a word.

Asked to stop, the router drains before Serve deletes the application (:meth:`Drain.run`). From then on it
answers every new request, ``/health`` included, with OpenAI's error shape: HTTP 503, code
``server_shutting_down`` and a Retry-After, which a load balancer reads as "take it out" and a client as
"retry" (Serve's proxy would answer a deleted application with a plain-text 404). The requests in flight
go on until they end or ``serve.graceful_shutdown_timeout_s`` runs out; then a stream still running is cut
with an error event of that code as its last event, never without a word, so that a client can tell a cut
from an end, and a whole (non-streamed) response still waiting gets the 503. Serve's delete then finds
nothing in flight.

The router watches the replica's event stream of each request (:meth:`Drain.watch`): a stream counts as in
flight until its last event (``Finished`` or a refusal), its failure, or its cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from rayft.serving.protocol import RequestError

SHUTTING_DOWN = "server_shutting_down"
CUT_WAIT_S = 5.0
"""How long the drain waits, once the cut streams were told, for their requests to let go."""


class ShuttingDownError(RequestError):
    """503: the server is stopping; ``retry_after_s`` is when the drain ends (at least 1 s)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(503, message, None, SHUTTING_DOWN)
        self.retry_after_s = max(1, math.ceil(retry_after_s))


class StreamCutError(Exception):
    """Raised into a request whose stream the drain cut; ``error`` is what the client is told."""

    def __init__(self, error: RequestError) -> None:
        super().__init__(error.message)
        self.error = error


def _is_last(event: Any) -> bool:
    """Whether ``event`` ends a replica's stream (its completion finished, or the request refused)."""
    return type(event).__name__ in ("Finished", "Refused")


class Watched:
    """A replica's event stream as the router reads it: counted in flight until it ends, and cut by the drain."""

    def __init__(self, events: Any, drain: Drain) -> None:
        self.events, self.drain, self.done = events, drain, False

    def __aiter__(self) -> Watched:
        return self

    async def __anext__(self) -> Any:
        if self.done:
            raise StopAsyncIteration
        try:
            event = await self.drain.next_or_cut(self.events)
        except BaseException:
            self._end()
            raise
        if _is_last(event):
            self._end()
        return event

    def cancel(self) -> None:
        """Stop the request on the replica (a client that left, a stream cut)."""
        self._end()
        self.events.cancel()

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.drain.leave()


class Drain:
    """The router's state as the server stops: whether it drains, until when, and the requests in flight."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.grace_s = 0.0
        self.in_flight = 0
        self.cut_streams = 0
        self._idle: asyncio.Event | None = None
        self._cut: asyncio.Event | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        """The idle and cut events, made in the router's event loop on first use."""
        if self._idle is None or self._cut is None:
            self._idle, self._cut = asyncio.Event(), asyncio.Event()
            if self.in_flight == 0:
                self._idle.set()
        return self._idle, self._cut

    def refusal(self) -> ShuttingDownError | None:
        """The answer to a new request while draining (None: serve it)."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        return ShuttingDownError(
            f"the server is shutting down and takes no new requests; retry after {max(1, math.ceil(left))} s, "
            "or send the request to another server",
            left,
        )

    def watch(self, events: Any) -> Watched:
        """``events`` (a replica's response stream), counted in flight until it ends."""
        idle, _ = self._events()
        self.in_flight += 1
        idle.clear()
        return Watched(events, self)

    def leave(self) -> None:
        """One watched stream ended."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._events()[0].set()

    async def next_or_cut(self, events: Any) -> Any:
        """The next event of ``events``, or :class:`StreamCutError` if the drain cuts first (a token may take long: the
        wait for it races the cut, whenever the drain begins)."""
        _, cut = self._events()
        following = asyncio.ensure_future(events.__anext__())
        stopped = asyncio.ensure_future(cut.wait())
        try:
            await asyncio.wait((following, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if following.done():
            return following.result()
        following.cancel()
        with contextlib.suppress(BaseException):
            await following
        self.cut_streams += 1
        raise self.cut_error()

    def cut_error(self) -> StreamCutError:
        """What a request cut by the drain raises, with what its client is told."""
        return StreamCutError(
            ShuttingDownError(
                f"the server shut down before this response finished (serve.graceful_shutdown_timeout_s = "
                f"{self.grace_s:g} s ran out); retry the request",
                1,
            )
        )

    async def run(self, grace_s: float) -> int:
        """Drain: refuse new requests from now on, wait up to ``grace_s`` for those in flight, then cut the
        streams still running (each ends with an error event). Returns how many were cut."""
        idle, cut = self._events()
        self.grace_s = grace_s
        if self.deadline is None:
            self.deadline = time.monotonic() + grace_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(idle.wait(), max(0.0, self.deadline - time.monotonic()))
        if not idle.is_set():
            cut.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(idle.wait(), CUT_WAIT_S)
        return self.cut_streams
