"""The HTTP ingress of ``rayft serve``: the OpenAI routes, on FastAPI inside a Serve deployment.

The router parses and checks each request (:mod:`rayft.serving.protocol`), sends it to the
deployment of its base model with the adapter as Serve's multiplexed model id, and turns the
replica's events into one JSON response or a server-sent event stream ending ``data: [DONE]``.
A client that goes away mid-stream cancels its request down to the replica, whose batch row stops.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' annotations as
# objects (`request: Request`), and Serve's ingress copies the methods out of this module's namespace.
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from rayft.serving.engine import Finished
from rayft.serving.protocol import (
    DONE,
    Endpoint,
    RequestError,
    ResponseBuilder,
    Usage,
    parse_request,
    sse,
    to_job,
    unknown_model,
)
from rayft.serving.replica import Refused, Started

log = logging.getLogger(__name__)


def _failure(exc: BaseException) -> RequestError:
    """A 500 for a generation that failed inside the replica, in the OpenAI error shape."""
    log.error("generation failed: %s: %s", type(exc).__name__, exc)
    return RequestError(500, f"generation failed in the model replica ({type(exc).__name__}); retry the request")


async def _whole(events: Any, reply: ResponseBuilder, prompt_tokens: int) -> Response:
    """The non-streamed response: every piece joined."""
    pieces: list[str] = []
    failure = RequestError(500, "the replica ended the request without finishing it; retry it")
    try:
        async for event in events:
            if isinstance(event, Finished):
                usage = Usage(prompt_tokens, event.completion_tokens)
                return JSONResponse(reply.response("".join(pieces), event.finish_reason, usage))
            pieces.append(event)
    except Exception as exc:
        failure = _failure(exc)
    return JSONResponse(failure.body(), status_code=failure.status)


async def _stream(
    events: Any, reply: ResponseBuilder, prompt_tokens: int, include_usage: bool, *, echo_role: bool
) -> AsyncIterator[bytes]:
    """Server-sent events: the role, each piece, the finish reason, the usage if asked, ``[DONE]``."""
    finished = False
    try:
        if echo_role:
            yield sse(reply.chunk(None, first=True))
        async for event in events:
            if isinstance(event, Finished):
                finished = True
                yield sse(reply.chunk(None, event.finish_reason))
                if include_usage:
                    yield sse(reply.usage_chunk(Usage(prompt_tokens, event.completion_tokens)))
                break
            yield sse(reply.chunk(event))
        yield DONE
    except Exception as exc:  # the status line has gone out already: the error is the stream's last event
        yield sse(_failure(exc).body())
    finally:
        if not finished:
            events.cancel()  # the client left (or the stream failed): free the replica's batch row


app = FastAPI(title="rayft serve", docs_url=None, redoc_url=None)


@serve.ingress(app)
class Router:
    """Routes OpenAI requests to the base models' deployments."""

    def __init__(self, handles: list[DeploymentHandle[Any]], routes: dict[str, tuple[int, str | None]]) -> None:
        from rayft.security import install_redaction

        install_redaction()
        self.handles, self.routes = handles, routes
        self.created = int(time.time())

    @app.get("/v1/models")
    def models(self) -> dict[str, Any]:
        """The served model ids."""
        data = [{"id": i, "object": "model", "created": self.created, "owned_by": "rayft"} for i in self.routes]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        """OpenAI chat completions: the messages through the model's chat template."""
        return await self._complete(await request.body(), "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI text completions: the prompt as it is."""
        return await self._complete(await request.body(), "completion")

    @app.get("/rayft/stats")
    async def stats(self) -> dict[str, Any]:
        """Each deployment's counters (from one of its replicas): model loads, adapter loads, rows in flight."""
        return {"deployments": [await handle.stats.remote() for handle in self.handles]}

    async def _complete(self, raw: bytes, endpoint: Endpoint) -> Response:
        try:
            request = parse_request(raw, endpoint)
            if request.model not in self.routes:
                raise unknown_model(request.model, list(self.routes))
        except RequestError as error:
            return JSONResponse(error.body(), status_code=error.status)
        index, adapter = self.routes[request.model]
        options: dict[str, Any] = {"stream": True}
        if adapter is not None:
            options["multiplexed_model_id"] = adapter
        events: Any = self.handles[index].options(**options).generate.remote(to_job(request))
        try:
            first = await events.__anext__()
        except Exception as exc:  # the replica failed before it started (an adapter that does not load)
            failed = _failure(exc)
            return JSONResponse(failed.body(), status_code=failed.status)
        if isinstance(first, Refused):
            return JSONResponse(first.body, status_code=first.status, headers=first.headers)
        assert isinstance(first, Started)
        reply = ResponseBuilder(endpoint, request.model)
        if not request.stream:
            return await _whole(events, reply, first.prompt_tokens)
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        chunks = _stream(events, reply, first.prompt_tokens, include_usage, echo_role=endpoint == "chat")
        return StreamingResponse(chunks, media_type="text/event-stream")
