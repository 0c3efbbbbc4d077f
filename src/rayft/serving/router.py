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
import json
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
from rayft.serving.adapters import RuntimeAdapters, parse_load, parse_unload
from rayft.serving.choices import ChoiceStream, whole_choice
from rayft.serving.drain import Drain, ShuttingDownError, StreamCutError
from rayft.serving.echo import check_echo, echo_events, echoed
from rayft.serving.keys import authorized
from rayft.serving.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from rayft.serving.metrics import RequestTimer, ServeMetrics
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
from rayft.serving.rows import Finished
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

    async def collect(self, events: Any, timer: RequestTimer | None) -> None:
        async for event in events:
            if isinstance(event, Finished):
                self.finished = event
                if timer is not None:
                    timer.finished()
                return
            if timer is not None:
                timer.piece()
            text, tokens = _piece(event)
            self.pieces.append(text)
            self.tokens.extend(tokens or ())


def _rendered(endpoint: Endpoint, tokens: list[TokenLogprob], job: Job, offset: int = 0) -> dict[str, Any] | None:
    """A choice's (or chunk's) ``logprobs`` when the request asked for them."""
    if not job.logprobs:
        return None
    return chat_logprobs(tokens) if endpoint == "chat" else completion_logprobs(tokens, offset)


async def _whole(streams: list[Any], jobs: list[Job], reply: ResponseBuilder, prompt_tokens: list[int],
                 timer: RequestTimer) -> Response:  # fmt: skip
    """The non-streamed response: every choice's pieces joined (the first choice's timed)."""
    choices = [_Choice() for _ in streams]
    try:
        timers = [timer, *([None] * (len(streams) - 1))]
        await asyncio.gather(*(c.collect(s, t) for c, s, t in zip(choices, streams, timers, strict=True)))
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
    timer.tokens(_prompt_tokens(jobs, prompt_tokens), completion)
    return JSONResponse(reply.response(body, Usage(_prompt_tokens(jobs, prompt_tokens), completion)))


def _prompt_tokens(jobs: list[Job], counts: list[int]) -> int:
    """The prompt tokens of a request: each prompt once, however many choices (``n``) it has."""
    return sum(count for job, count in zip(jobs, counts, strict=True) if job.copy == 0)


async def _stream(
    streams: list[Any],
    jobs: list[Job],
    reply: ResponseBuilder,
    prompt_tokens: list[int],
    *,
    include_usage: bool,
    timer: RequestTimer,
) -> AsyncIterator[bytes]:
    """Server-sent events: per choice the role, each piece, the finish reason; then the usage if asked,
    and ``[DONE]``. The choices of a batched prompt run together on the replicas and are sent in turn (the
    first one's pieces timed: the others' wait for it)."""
    finished = [False] * len(streams)
    usage = Usage(_prompt_tokens(jobs, prompt_tokens), 0)
    try:
        for index, (events, job) in enumerate(zip(streams, jobs, strict=True)):
            if reply.endpoint == "chat":
                yield sse(reply.chunk(None, first=True, index=index))
            offset, choice = 0, ChoiceStream(reply, index, job)
            async for event in events:
                if index == 0:
                    timer.event(end=isinstance(event, Finished))
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
        timer.tokens(usage.prompt_tokens, usage.completion_tokens)
        if include_usage:
            yield sse(reply.usage_chunk(usage))
        timer.done(200)
        yield DONE
    except Exception as exc:  # the status line has gone out already: the error is the stream's last event
        failure = _failure(exc)
        timer.done(failure.status, failure.body()["error"])
        yield sse(failure.body())
    finally:
        timer.done(CLIENT_GONE, {"code": "client_closed_request"})  # unless it ended above: the client left
        for events, done in zip(streams, finished, strict=True):
            if not done:
                events.cancel()  # the client left (or the stream failed): free the replica's batch row


CLIENT_GONE = 499
"""The status a request counts under in the metrics when its client left before the end (nginx's)."""


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


ROUTES = (
    "/v1/models",
    "/v1/models/{model}",
    "/v1/chat/completions",
    "/v1/completions",
    "/health",
    "/metrics",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
)
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
        max_runtime_adapters: int = 8,
    ) -> None:
        from rayft.security import install_redaction

        install_redaction()
        quiet_serve_console(keep_access=access_log_console)
        self.handles, self.routes, self.key_digests = handles, routes, key_digests
        self.created = int(time.time())
        self.closing = Drain()
        self.metrics = ServeMetrics()
        self.base_ids = self._bases()
        self.runtime = RuntimeAdapters(max_runtime_adapters)

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
        return await self._counted(request, "chat")

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI text completions: the prompt (text or token ids, one or a batch) as it is."""
        return await self._counted(request, "completion")

    @app.get("/metrics")
    async def prometheus(self, request: Request) -> Response:
        """Prometheus' text exposition of the serving metrics (:mod:`rayft.serving.metrics`); the deployments'
        load is asked of one replica each (a deployment that does not answer in time keeps its last values)."""
        if refused := self._refused(request):
            return refused
        loads = await asyncio.gather(*(asyncio.wait_for(h.load.remote(), READY_TIMEOUT_S) for h in self.handles),
                                     return_exceptions=True)  # fmt: skip
        for model, load in zip(self.base_ids, loads, strict=True):
            if isinstance(load, dict):
                self.metrics.set_load(model, load)
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/rayft/stats")
    async def stats(self, request: Request) -> Response:
        """Each deployment's counters (from one of its replicas): model loads, adapter loads, rows in flight."""
        if refused := self._refused(request):
            return refused
        return JSONResponse({"deployments": [await handle.stats.remote() for handle in self.handles]})

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(self, request: Request) -> Response:
        """Load a LoRA adapter at run time, as vLLM's route does: ``{"lora_name", "lora_path"}`` (a directory or
        URI; ``base_model_name`` where several bases are served); past serve.max_runtime_adapters the least
        recently used adapter loaded at run time is unloaded (see :mod:`rayft.serving.adapters`)."""
        if refused := self._refused(request):
            return refused
        try:
            load = parse_load(await request.body())
            index = self._base_for(load.lora_name, load.base_model_name)
        except RequestError as error:
            return _error(error)
        handle = self.handles[index].options(multiplexed_model_id=load.lora_name)
        answer = await handle.add_adapter.remote(load.lora_path)
        if isinstance(answer, Refused):
            return JSONResponse(answer.body, status_code=answer.status)
        self.routes[load.lora_name] = (index, load.lora_name)
        evicted = self.runtime.add(load.lora_name, load.lora_path)
        for name in evicted:
            await self._unload(name)
        body = {"object": "lora_adapter", "id": load.lora_name, "base_model": self.base_ids[index], "evicted": evicted}
        return JSONResponse(body)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(self, request: Request) -> Response:
        """Unload an adapter loaded at run time (``{"lora_name"}``); those given at start stay."""
        if refused := self._refused(request):
            return refused
        try:
            name = parse_unload(await request.body())
            if name not in self.runtime:
                if name in self.routes:
                    raise RequestError(400, f"{name!r} was given at start; only adapters loaded at run time "
                                       "(/v1/load_lora_adapter) can be unloaded", "lora_name")  # fmt: skip
                raise unknown_model(
                    name, [n for n in self.routes if n in self.runtime] or ["(none loaded at run time)"]
                )
        except RequestError as error:
            return _error(error)
        await self._unload(name)
        return JSONResponse({"object": "lora_adapter", "id": name, "unloaded": True})

    def _base_for(self, name: str, base: str | None) -> int:
        """The deployment a runtime adapter goes on: the named base, or the only one."""
        if self.runtime.limit == 0:
            raise RequestError(400, "loading adapters at run time is off on this server (serve.max_runtime_adapters: "
                               "0); set it above 0, or give the adapter at start")  # fmt: skip
        if name in self.routes:
            given = "was given at start" if name not in self.runtime else "is loaded already; unload it first"
            raise RequestError(400, f"lora_name {name!r} {given}; choose another name", "lora_name")
        if base is not None:
            if base not in self.base_ids:
                raise RequestError(400, f"base_model_name {base!r} is not a served base model; served bases: "
                                   f"{', '.join(self.base_ids)}", "base_model_name")  # fmt: skip
            return self.base_ids.index(base)
        if len(self.base_ids) > 1:
            raise RequestError(400, f"this server serves several base models ({', '.join(self.base_ids)}); say which "
                               "the adapter goes on with base_model_name", "base_model_name")  # fmt: skip
        return 0

    async def _unload(self, name: str) -> None:
        index, _ = self.routes.pop(name)
        self.runtime.remove(name)
        try:
            await self.handles[index].options(multiplexed_model_id=name).remove_adapter.remote(name)
        except Exception as exc:  # the route is gone already; a replica's cache unloads the weights in time
            log.warning("unloading adapter %s failed in its replica: %s: %s", name, type(exc).__name__, exc)

    def _labels(self, model: str) -> tuple[str, str | None]:
        """A served model id's metric labels: its base model's id and its adapter (None: the base itself)."""
        index, adapter = self.routes[model]
        return self.base_ids[index], adapter

    async def _counted(self, request: Request, endpoint: Endpoint) -> Response:
        """A completion request, answered and counted in the metrics (a stream: once it ends)."""
        timer = self.metrics.timer("", None)
        response = self._refused(request) or await self._complete(await request.body(), endpoint, timer)
        if not isinstance(response, StreamingResponse):
            error = json.loads(bytes(response.body)).get("error") if response.status_code >= 400 else None
            timer.done(response.status_code, error)
        return response

    def _handle(self, model: str) -> Any:
        index, adapter = self.routes[model]
        return self.handles[index].options(multiplexed_model_id=adapter) if adapter else self.handles[index]

    async def _complete(self, raw: bytes, endpoint: Endpoint, timer: RequestTimer) -> Response:
        try:
            request = parse_request(raw, endpoint)
            if request.model not in self.routes:
                raise unknown_model(request.model, list(self.routes))
            timer.relabel(*self._labels(request.model))
            self.runtime.touch(request.model)
            jobs = to_jobs(request)
            if any(job.echo for job in jobs):
                for job in jobs:
                    check_echo(job)
                return await self._echo(request, jobs, timer)
        except RequestError as error:
            return _error(error)
        return await self._generate(request, jobs, endpoint, timer)

    async def _echo(self, request: ChatRequest | CompletionRequest, jobs: list[Job], timer: RequestTimer) -> Response:
        handle = self._handle(request.model)
        source = self.runtime.source(request.model)
        results = await asyncio.gather(*(handle.score.remote(job, source) for job in jobs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                return _error(_failure(result))
            if isinstance(result, Refused):
                return JSONResponse(result.body, status_code=result.status)
        scored: list[Scored] = results  # type: ignore[assignment]
        reply = ResponseBuilder("completion", request.model)
        choices = [echoed(reply, i, job, s) for i, (job, s) in enumerate(zip(jobs, scored, strict=True))]
        usage = Usage(sum(len(s.prompt) for s in scored), sum(len(s.completion) for s in scored))
        timer.tokens(usage.prompt_tokens, usage.completion_tokens)
        if not request.stream:
            return JSONResponse(reply.response(choices, usage))
        timer.done(200)  # whole already: the stream only sends it
        return StreamingResponse(echo_events(reply, choices, usage, request), media_type="text/event-stream")

    async def _generate(
        self, request: ChatRequest | CompletionRequest, jobs: list[Job], endpoint: Endpoint, timer: RequestTimer
    ) -> Response:
        handle = self._handle(request.model).options(stream=True)
        source = self.runtime.source(request.model)
        streams: list[Any] = [self.closing.watch(handle.generate.remote(job, source)) for job in jobs]
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
            return await _whole(streams, jobs, reply, prompt_tokens, timer)
        include_usage = bool((request.stream_options or {}).get("include_usage"))
        chunks = _stream(streams, jobs, reply, prompt_tokens, include_usage=include_usage, timer=timer)
        return StreamingResponse(chunks, media_type="text/event-stream")
