"""The HTTP ingress of ``rayft serve``: the OpenAI routes, on FastAPI inside a Serve deployment.

The router parses and checks each request (:mod:`rayft.serving.protocol`), sends it to the
deployment of its base model with the adapter as Serve's multiplexed model id, and turns the
replica's events into one JSON response or a server-sent event stream ending ``data: [DONE]``.
A client that goes away mid-stream cancels its request down to the replica, whose batch row stops.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures' annotations as
# objects (`request: Request`), and Serve's ingress copies the methods out of this module's namespace.
import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from rayft.serving.access_log import quiet_serve_console
from rayft.serving.choices import ChoiceStream, whole_choice
from rayft.serving.drain import Drain, ShuttingDownError, StreamCutError
from rayft.serving.engine import Finished
from rayft.serving.keys import authorized
from rayft.serving.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from rayft.serving.protocol import (
    DONE,
    ChatRequest,
    CompletionRequest,
    Endpoint,
    Job,
    RequestError,
    ResponseBuilder,
    Usage,
    parse_request,
    sse,
    to_jobs,
    unknown_model,
)
from rayft.serving.replica import Refused, Started
from rayft.serving.scoring import Scored

log = logging.getLogger(__name__)


READY_TIMEOUT_S = 2.0
"""How long ``/health`` waits for each model deployment's answer before it reports that model loading."""


def _failure(exc: BaseException) -> RequestError:
    """A 500 for a generation that failed inside the replica, in the OpenAI error shape; a 503 when Serve's
    queue for the model's replicas was full (``serve.serve_queue_requests``); the drain's answer to a request it cut."""
    if isinstance(exc, StreamCutError):
        return exc.error
    if isinstance(exc, BackPressureError):
        return BusyError(exc.retry_after_s)
    log.error("generation failed: %s: %s", type(exc).__name__, exc)
    return RequestError(500, f"generation failed in the model replica ({type(exc).__name__}); retry the request")


class BusyError(RequestError):
    """503: as many requests wait in Serve's queue for the model's replicas as serve.serve_queue_requests allows."""

    def __init__(self, retry_after_s: float | None) -> None:
        self.retry_after_s = math.ceil(retry_after_s or 1)
        super().__init__(
            503,
            "the model's replicas are busy and Serve's queue for them is full (serve.serve_queue_requests); retry "
            f"after {self.retry_after_s} s, or add replicas",
            None,
            "server_busy",
        )


def _error(error: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    if isinstance(error, BusyError | ShuttingDownError):
        headers = {**(headers or {}), "Retry-After": str(error.retry_after_s)}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _piece(event: Any) -> tuple[str, list[TokenLogprob] | None]:
    """The text of a streamed event and the log-probabilities of its tokens, when the engine sent them."""
    if isinstance(event, str):
        return event, None
    return str(event.text), getattr(event, "logprobs", None)


class _Choice:
    """One choice as its events arrive: its text, its tokens' log-probabilities, how it ended."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.tokens: list[TokenLogprob] = []
        self.finished: Finished | None = None

    async def collect(self, events: Any) -> None:
        async for event in events:
            if isinstance(event, Finished):
                self.finished = event
                return
            text, tokens = _piece(event)
            self.pieces.append(text)
            self.tokens.extend(tokens or ())


def _rendered(endpoint: Endpoint, tokens: list[TokenLogprob], job: Job, offset: int = 0) -> dict[str, Any] | None:
    """A choice's (or chunk's) ``logprobs`` when the request asked for them."""
    if not job.logprobs:
        return None
    return chat_logprobs(tokens) if endpoint == "chat" else completion_logprobs(tokens, offset)


async def _whole(streams: list[Any], jobs: list[Job], reply: ResponseBuilder, prompt_tokens: list[int]) -> Response:
    """The non-streamed response: every choice's pieces joined."""
    choices = [_Choice() for _ in streams]
    try:
        await asyncio.gather(*(c.collect(s) for c, s in zip(choices, streams, strict=True)))
    except Exception as exc:
        return _error(_failure(exc))
    if any(c.finished is None for c in choices):
        return _error(RequestError(500, "the replica ended the request without finishing it; retry it"))
    body = [
        whole_choice(
            reply,
            i,
            job,
            "".join(c.pieces),
            c.finished.finish_reason,
            logprobs=_rendered(reply.endpoint, c.tokens, job),
        )
        for i, (c, job) in enumerate(zip(choices, jobs, strict=True))
        if c.finished is not None
    ]
    completion = sum(c.finished.completion_tokens for c in choices if c.finished is not None)
    return JSONResponse(reply.response(body, Usage(_prompt_tokens(jobs, prompt_tokens), completion)))


def _prompt_tokens(jobs: list[Job], counts: list[int]) -> int:
    """The prompt tokens of a request: each prompt once, however many choices (``n``) it has."""
    return sum(count for job, count in zip(jobs, counts, strict=True) if job.copy == 0)


async def _stream(
    streams: list[Any], jobs: list[Job], reply: ResponseBuilder, prompt_tokens: list[int], include_usage: bool
) -> AsyncIterator[bytes]:
    """Server-sent events: per choice the role, each piece, the finish reason; then the usage if asked,
    and ``[DONE]``. The choices of a batched prompt run together on the replicas and are sent in turn."""
    finished = [False] * len(streams)
    usage = Usage(_prompt_tokens(jobs, prompt_tokens), 0)
    try:
        for index, (events, job) in enumerate(zip(streams, jobs, strict=True)):
            if reply.endpoint == "chat":
                yield sse(reply.chunk(None, first=True, index=index))
            offset, choice = 0, ChoiceStream(reply, index, job)
            async for event in events:
                if isinstance(event, Finished):
                    finished[index] = True
                    usage += Usage(0, event.completion_tokens)
                    for chunk in choice.finish(event.finish_reason):
                        yield sse(chunk)
                    break
                text, tokens = _piece(event)
                logprobs = _rendered(reply.endpoint, list(tokens or ()), job, offset)
                offset += len(text)
                for chunk in choice.piece(text, logprobs):
                    yield sse(chunk)
        if include_usage:
            yield sse(reply.usage_chunk(usage))
        yield DONE
    except Exception as exc:  # the status line has gone out already: the error is the stream's last event
        yield sse(_failure(exc).body())
    finally:
        for events, done in zip(streams, finished, strict=True):
            if not done:
                events.cancel()  # the client left (or the stream failed): free the replica's batch row


def _echoed(reply: ResponseBuilder, index: int, job: Job, scored: Scored) -> dict[str, Any]:
    """A completions choice of an ``echo`` request: the prompt, then its continuation."""
    tokens = [*scored.prompt, *scored.completion]
    logprobs = completion_logprobs(tokens) if job.logprobs else None
    return reply.choice(index, scored.prompt_text + scored.text, scored.finish_reason, logprobs)


def _check_echo(job: Job) -> None:
    """Refuse what the scoring path of ``echo`` does not do, rather than do something else."""
    if job.max_tokens != 0 and job.temperature > 0:
        raise RequestError(
            400, "echo with a completion is decoded greedily; set temperature to 0, or max_tokens to 0 to only "
            "score the prompt", "temperature",
        )  # fmt: skip
    if job.max_tokens != 0 and job.stop:
        raise RequestError(400, "stop is not applied with echo; leave stop out, or set max_tokens to 0", "stop")
    shaping = {
        "top_k": job.top_k,
        "min_p": job.min_p,
        "presence_penalty": job.presence_penalty,
        "frequency_penalty": job.frequency_penalty,
        "repetition_penalty": job.repetition_penalty - 1.0,
    }
    if job.max_tokens != 0 and (named := [name for name, value in shaping.items() if value]):
        raise RequestError(400, f"{named[0]} is not applied with echo, whose continuation is greedy; leave it out, "
                           "or set max_tokens to 0", named[0])  # fmt: skip


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing errors (unknown path, wrong method) in OpenAI's error shape instead of FastAPI's."""
    if exc.status_code == 404:
        message = f"no route {request.url.path}; this server answers {', '.join(ROUTES)}"
    elif exc.status_code == 405:
        message = (
            f"{request.method} is not allowed on {request.url.path}; use {exc.headers and exc.headers.get('Allow')}"
        )
    else:
        message = str(exc.detail)
    return _error(RequestError(exc.status_code, message), headers=dict(exc.headers or {}))


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Anything else the router raises: a 500 in OpenAI's error shape, never a plain-text page."""
    log.error("request to %s failed: %s: %s", request.url.path, type(exc).__name__, exc)
    return _error(RequestError(500, f"the server failed on this request ({type(exc).__name__}); retry it"))


async def _ready(handle: Any) -> bool:
    try:
        return bool(await asyncio.wait_for(handle.ready.remote(), READY_TIMEOUT_S))
    except Exception:  # a timeout (no replica up yet) or a replica that failed: not ready either way
        return False


async def _echo_events(
    reply: ResponseBuilder, choices: list[dict[str, Any]], usage: Usage, request: ChatRequest | CompletionRequest
) -> AsyncIterator[bytes]:
    """A streamed ``echo`` response: each choice whole in one chunk, then its finish reason."""
    for choice in choices:
        yield sse(reply.chunk(choice["text"], index=choice["index"], logprobs=choice["logprobs"]))
        yield sse(reply.chunk(None, choice["finish_reason"], index=choice["index"]))
    if (request.stream_options or {}).get("include_usage"):
        yield sse(reply.usage_chunk(usage))
    yield DONE


ROUTES = ("/v1/models", "/v1/models/{model}", "/v1/chat/completions", "/v1/completions", "/health")
"""The routes of the OpenAI surface, as a routing error names them."""

app = FastAPI(title="rayft serve", docs_url=None, redoc_url=None, openapi_url=None)
app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
app.add_exception_handler(Exception, _unexpected)


@serve.ingress(app)
class Router:
    """Routes OpenAI requests to the base models' deployments."""

    def __init__(
        self,
        handles: list[DeploymentHandle[Any]],
        routes: dict[str, tuple[int, str | None]],
        key_digests: tuple[bytes, ...] = (),
        access_log_console: bool = False,
    ) -> None:
        from rayft.security import install_redaction

        install_redaction()
        quiet_serve_console(keep_access=access_log_console)
        self.handles, self.routes, self.key_digests = handles, routes, key_digests
        self.created = int(time.time())
        self.closing = Drain()

    def _model(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "rayft"}

    async def drain(self, grace_s: float) -> int:
        """Stop taking requests (503 ``server_shutting_down``), let those in flight end for up to ``grace_s``,
        then end the streams still running with an error event; how many were cut (see :mod:`~rayft.serving.drain`)."""
        return await self.closing.run(grace_s)

    def _refused(self, request: Request) -> JSONResponse | None:
        """503 while the server stops; 401 unless the request carries one of the keys (None: let it through)."""
        if (closing := self.closing.refusal()) is not None:
            return _error(closing)
        if authorized(request.headers.get("authorization"), self.key_digests):
            return None
        error = RequestError(
            401, "this server needs an API key: send 'Authorization: Bearer <key>' with one of its keys "
            "(the OpenAI client's api_key)", code="invalid_api_key",
        )  # fmt: skip
        return _error(error, headers={"WWW-Authenticate": "Bearer"})

    @app.get("/v1/models")
    def models(self, request: Request) -> Response:
        """The served model ids."""
        if refused := self._refused(request):
            return refused
        return JSONResponse({"object": "list", "data": [self._model(i) for i in self.routes]})

    @app.get("/v1/models/{model_id:path}")
    def model(self, model_id: str, request: Request) -> Response:
        """One served model (ids may hold slashes: ``run/step-000100``, ``org/name``)."""
        if refused := self._refused(request):
            return refused
        if model_id not in self.routes:
            return _error(unknown_model(model_id, list(self.routes)))
        return JSONResponse(self._model(model_id))

    @app.get("/health")
    async def health(self) -> Response:
        """200 once every model deployment answers (its model loaded), else 503 naming those still loading (or
        that the server is shutting down)."""
        if (closing := self.closing.refusal()) is not None:
            return _error(closing)
        waiting = [group for group, handle in zip(self._bases(), self.handles, strict=True) if not await _ready(handle)]
        if waiting:
            message = f"not ready: {', '.join(waiting)} still loading (or unreachable); retry shortly"
            return _error(RequestError(503, message, code="model_not_ready"), headers={"Retry-After": "2"})
        return JSONResponse({"status": "ok", "models": list(self.routes)})

    def _bases(self) -> list[str]:
        return [next(m for m, (i, adapter) in self.routes.items() if i == n and adapter is None) for n in
                range(len(self.handles))]  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> Response:
        """OpenAI chat completions: the messages through the model's chat template."""
        return self._refused(request) or await self._complete(await request.body(), "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI text completions: the prompt (text or token ids, one or a batch) as it is."""
        return self._refused(request) or await self._complete(await request.body(), "completion")

    @app.get("/rayft/stats")
    async def stats(self, request: Request) -> Response:
        """Each deployment's counters (from one of its replicas): model loads, adapter loads, rows in flight."""
        if refused := self._refused(request):
            return refused
        return JSONResponse({"deployments": [await handle.stats.remote() for handle in self.handles]})

    def _handle(self, model: str) -> Any:
        index, adapter = self.routes[model]
        return self.handles[index].options(multiplexed_model_id=adapter) if adapter else self.handles[index]

    async def _complete(self, raw: bytes, endpoint: Endpoint) -> Response:
        try:
            request = parse_request(raw, endpoint)
            if request.model not in self.routes:
                raise unknown_model(request.model, list(self.routes))
            jobs = to_jobs(request)
            if any(job.echo for job in jobs):
                for job in jobs:
                    _check_echo(job)
                return await self._echo(request, jobs)
        except RequestError as error:
            return _error(error)
        return await self._generate(request, jobs, endpoint)

    async def _echo(self, request: ChatRequest | CompletionRequest, jobs: list[Job]) -> Response:
        handle = self._handle(request.model)
        results = await asyncio.gather(*(handle.score.remote(job) for job in jobs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                return _error(_failure(result))
            if isinstance(result, Refused):
                return JSONResponse(result.body, status_code=result.status)
        scored: list[Scored] = results  # type: ignore[assignment]
        reply = ResponseBuilder("completion", request.model)
        choices = [_echoed(reply, i, job, s) for i, (job, s) in enumerate(zip(jobs, scored, strict=True))]
        usage = Usage(sum(len(s.prompt) for s in scored), sum(len(s.completion) for s in scored))
        if not request.stream:
            return JSONResponse(reply.response(choices, usage))
        return StreamingResponse(_echo_events(reply, choices, usage, request), media_type="text/event-stream")

    async def _generate(
        self, request: ChatRequest | CompletionRequest, jobs: list[Job], endpoint: Endpoint
    ) -> Response:
        handle = self._handle(request.model).options(stream=True)
        streams: list[Any] = [self.closing.watch(handle.generate.remote(job)) for job in jobs]
        prompt_tokens: list[int] = []
        for events in streams:
            try:
                first = await events.__anext__()
            except Exception as exc:  # the replica failed before it started (an adapter that does not load),
                error = _failure(exc)  # or Serve's queue for the replicas was full
                retry = isinstance(error, BusyError | ShuttingDownError)
                headers = {"Retry-After": str(error.retry_after_s)} if retry else {}  # type: ignore[attr-defined]
                first = Refused(error.status, error.body(), headers)
            if isinstance(first, Refused):
                for other in streams:
                    # Cancelling a request Serve refused raises its refusal again: the answer is this one.
                    with contextlib.suppress(Exception):
                        other.cancel()
                return JSONResponse(first.body, status_code=first.status, headers=first.headers)
            assert isinstance(first, Started)
            prompt_tokens.append(first.prompt_tokens)
        reply = ResponseBuilder(endpoint, request.model)
        if not request.stream:
            return await _whole(streams, jobs, reply, prompt_tokens)
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        chunks = _stream(streams, jobs, reply, prompt_tokens, include_usage)
        return StreamingResponse(chunks, media_type="text/event-stream")
