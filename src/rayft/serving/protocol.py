"""The OpenAI wire format of ``rayft serve`` (pure: no model, no Ray, no HTTP server).

Requests are parsed strictly: a field of the wrong type, a value out of range or a body that is not
a JSON object is a :class:`RequestError` (HTTP 400, or 404 for an unknown model) with the OpenAI
error shape. A field this server does not honour is refused by name (400), never ignored, so that a
client never takes an answer for one that honoured it. The responses and stream chunks are built
here too, so the router only moves them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rayft.generation.backend import Prompt
from rayft.serving.chat_fields import (
    ChatMessage,
    FieldError,
    ResponseFormat,
    Tool,
    ToolChoice,
    ToolUse,
    tool_use,
)

Endpoint = Literal["chat", "completion"]


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_error", 503: "service_unavailable_error"}  # fmt: skip
"""OpenAI's error ``type`` by HTTP status; other 4xx are ``invalid_request_error``, other 5xx ``server_error``."""


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}`` as OpenAI's API returns it."""
        kind = _ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


MAX_PROMPTS = 256
"""The most prompts one completions request may batch (each becomes one choice)."""

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token ``logprobs`` (completions) or ``top_logprobs`` (chat) may ask for."""


NO_TOOLS = ToolUse()
"""A request without tools, response format or forced call."""

MAX_CHOICES = 16
"""The most choices (``n``) one request may ask for."""

UNSUPPORTED = {
    "logit_bias": "send the request without logit_bias",
    "best_of": "ask for n choices instead, and pick among them",
    "suffix": "send the prompt without a suffix",
    "functions": "send them as tools: [{'type': 'function', 'function': {...}}]",
    "function_call": "send it as tool_choice",
    "store": "keep the responses on the client",
    "prediction": "leave prediction out",
    "audio": "ask for text",
    "modalities": "ask for text",
    "reasoning_effort": "leave reasoning_effort out",
    "web_search_options": "leave web_search_options out",
}
"""OpenAI fields this server does not honour, with what to do instead (any other unknown field is refused too)."""


class _Sampling(BaseModel):
    """The fields both endpoints share; strict, so that "10" is not taken for 10."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: str | None = None  # an end user's id for the caller's own records; it changes no output
    metadata: dict[str, str] | None = None  # the caller's own tags; they change no output


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    def tool_use(self) -> ToolUse:
        """What the request's tools, tool_choice and response_format ask of the replica and the router."""
        return tool_use(self.tools, self.tool_choice, self.response_format, self.parallel_tool_calls)


_PROMPT_SHAPES = "give a string, a list of strings, token ids (integers >= 0), or a list of token id lists"

TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Sampling):
    """POST /v1/completions: one prompt or a batch of them, each text or token ids."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False

    def prompts(self) -> list[str | tuple[int, ...]]:
        """Each prompt of the request: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [tuple(p for p in prompt if isinstance(p, int))]
        return [p if isinstance(p, str) else tuple(p) for p in prompt if not isinstance(p, int)]


@dataclass(frozen=True)
class Job:
    """What a replica generates for one request: the prompt and the sampling, as plain values.

    Attributes:
        prompt: The text or chat conversation (empty when ``prompt_ids`` is given).
        prompt_ids: The prompt as token ids, fed to the model as they are (no template).
        logprobs: Whether each generated token's log-probability comes back with its text.
        top_logprobs: How many alternatives per generated token come back with it (0: none).
        echo: Whether the prompt's own tokens and log-probabilities come back before the completion.
        top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty: Sampling, as vLLM reads them
            (:mod:`rayft.serving.sampling`).
        tools: The tools rendered into the prompt, the calls read back, and the grammar the output must match.
    """

    prompt: Prompt
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    prompt_ids: tuple[int, ...] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    tools: ToolUse = NO_TOOLS
    copy: int = 0  # which of the prompt's n choices this is (usage counts the prompt's tokens once)


def parse_request(raw: bytes, endpoint: Endpoint) -> ChatRequest | CompletionRequest:
    """The request of a body, or a :class:`RequestError` naming the first bad field."""
    body = _json_object(raw)
    model = ChatRequest if endpoint == "chat" else CompletionRequest
    try:
        request = model.model_validate(body)
    except (ValidationError, RecursionError) as exc:
        raise _invalid(exc) from None
    if isinstance(request, CompletionRequest):
        _check_prompts(request.prompts())
        if request.max_tokens == 0 and not request.echo:
            raise RequestError(400, "max_tokens: 0 asks for nothing without echo; ask for 1 or more, or set echo: true",
                               "max_tokens")  # fmt: skip
    elif request.top_logprobs and not request.logprobs:
        raise RequestError(
            400, "top_logprobs: needs logprobs: true; set both, or leave top_logprobs out", "top_logprobs"
        )
    else:
        try:
            request.tool_use()
        except FieldError as exc:
            raise RequestError(400, f"{exc.param}: {exc.message}", exc.param) from None
    if isinstance(request, CompletionRequest) and request.echo and request.n > 1:
        raise RequestError(400, "n: echo scores the prompt once; ask for n: 1 with echo", "n")
    return request


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(400, "the request body nests too deeply to read; send a flatter JSON object") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise RequestError(400, f"the request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body is a JSON {type(body).__name__}; send a JSON object")
    return body


def _invalid(exc: ValidationError | RecursionError) -> RequestError:
    if isinstance(exc, RecursionError):
        return RequestError(400, "the request body nests too deeply to read; send a flatter JSON object")
    error = exc.errors()[0]
    if (
        error["loc"][:1] == ("prompt",) and error["type"] != "missing"
    ):  # the union's own errors name its branches, not what to send
        return RequestError(400, f"prompt: {_PROMPT_SHAPES} (got {_shown(error.get('input'))})", "prompt")
    param = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        field = str(error["loc"][-1])
        hint = UNSUPPORTED.get(field, "leave it out") if len(error["loc"]) == 1 else "leave it out"
        return RequestError(400, f"{param}: this server does not support {field!r}; {hint}", param,
                            "unsupported_parameter")  # fmt: skip
    message = error["msg"].removeprefix("Value error, ")
    return RequestError(400, f"{param}: {message} (got {_shown(error.get('input'))})", param)


def _check_prompts(prompts: list[str | tuple[int, ...]]) -> None:
    if not prompts:
        raise RequestError(400, "prompt: the list of prompts is empty; send at least one prompt", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(
            400, f"prompt: {len(prompts)} prompts in one request; send at most {MAX_PROMPTS} per request", "prompt"
        )
    for index, prompt in enumerate(prompts):
        if not prompt:
            where = "prompt" if len(prompts) == 1 else f"prompt.{index}"
            raise RequestError(400, f"{where}: the prompt is empty; send at least one character or token id", where)


def to_jobs(request: ChatRequest | CompletionRequest) -> list[Job]:
    """The generation jobs of a parsed request: ``n`` per prompt (one, or each of a batched completion's),
    in the order of the response's choices; choice ``i`` of a seeded request samples with ``seed + i``."""
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    shared: dict[str, Any] = {
        "temperature": request.temperature, "top_p": request.top_p, "stop": stop, "top_k": max(request.top_k, 0),
        "min_p": request.min_p, "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty, "repetition_penalty": request.repetition_penalty,
    }  # fmt: skip
    if isinstance(request, ChatRequest):
        prompt = cast("Prompt", [m.to_prompt() for m in request.messages])  # messages with tool calls too
        max_tokens = request.max_completion_tokens or request.max_tokens
        top = request.top_logprobs or 0
        one = Job(prompt, max_tokens, seed=request.seed, logprobs=request.logprobs, top_logprobs=top,
                  tools=request.tool_use(), **shared)  # fmt: skip
        return _copies([one], request.n)
    wanted = request.logprobs is not None
    top = request.logprobs or 0
    jobs = [
        Job(p, request.max_tokens, seed=request.seed, logprobs=wanted, top_logprobs=top, echo=request.echo, **shared)
        if isinstance(p, str)
        else Job(
            "",
            request.max_tokens,
            seed=request.seed,
            prompt_ids=p,
            logprobs=wanted,
            top_logprobs=top,
            echo=request.echo,
            **shared,
        )
        for p in request.prompts()
    ]
    return _copies(jobs, request.n)


def _copies(jobs: list[Job], n: int) -> list[Job]:
    """Each job ``n`` times in a row, each copy seeded apart when the request gives a seed."""
    if n == 1:
        return jobs
    return [replace(job, copy=i, seed=None if job.seed is None else job.seed + i) for job in jobs for i in range(n)]


def unknown_model(model: str, served: list[str]) -> RequestError:
    """404 for a model id that is not served, naming those that are."""
    return RequestError(
        404, f"the model {model!r} does not exist; served models: {', '.join(served)}", "model", "model_not_found"
    )


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, BaseModel) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    def to_dict(self) -> dict[str, int]:
        """The ``usage`` object of a response."""
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


class ResponseBuilder:
    """The responses and stream chunks of one request, all with one id and creation time."""

    def __init__(self, endpoint: Endpoint, model: str) -> None:
        self.endpoint, self.model = endpoint, model
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.endpoint == "chat" else "text_completion"
        if chunk and self.endpoint == "chat":
            kind += ".chunk"  # OpenAI streams text completions as text_completion objects
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(
        self, index: int, text: str | None, finish_reason: str, logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One choice of a whole response (``logprobs`` in the endpoint's shape, see :mod:`.logprobs`; a chat
        message's ``tool_calls`` in OpenAI's shape, when the model called tools)."""
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def response(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        return {**self._envelope(False), "choices": choices, "usage": usage.to_dict()}

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        *,
        first: bool = False,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        tool_call: tuple[int, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One streamed piece (``text`` None: an empty delta, with the finish reason); ``tool_call`` is a call's
        delta, ``(its index among the choice's calls, {"id", "type", "function": {"name", "arguments"}})``
        or only the arguments' next piece."""
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if tool_call is not None:
                delta["tool_calls"] = [{"index": tool_call[0], **tool_call[1]}]
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs}
        choice["finish_reason"] = finish_reason
        return {**self._envelope(True), "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk when the client asked for ``stream_options.include_usage``: no choices, the usage."""
        return {**self._envelope(True), "choices": [], "usage": usage.to_dict()}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` (or ``data: [DONE]``) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")
"""The event that ends an OpenAI stream."""
