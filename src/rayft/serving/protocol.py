"""The OpenAI wire format of ``rayft serve`` (pure: no model, no Ray, no HTTP server).

Requests are parsed strictly: a field of the wrong type, a value out of range or a body that is not
a JSON object is a :class:`RequestError` (HTTP 400, or 404 for an unknown model) with the OpenAI
error shape; fields this server does not use are ignored, as OpenAI's own server does. The
responses and stream chunks are built here too, so the router only moves them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rayft.generation.backend import Message, Prompt

Endpoint = Literal["chat", "completion"]


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        """``{"error": {...}}`` as OpenAI's API returns it."""
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class _Sampling(BaseModel):
    """The fields both endpoints share; strict, so that "10" is not taken for 10."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(1, ge=1, le=1)


class _ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[_ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str]


@dataclass(frozen=True)
class Job:
    """What a replica generates for one request: the prompt and the sampling, as plain values."""

    prompt: Prompt
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None


def parse_request(raw: bytes, endpoint: Endpoint) -> ChatRequest | CompletionRequest:
    """The request of a body, or a :class:`RequestError` naming the first bad field."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body is a JSON {type(body).__name__}; send a JSON object")
    model = ChatRequest if endpoint == "chat" else CompletionRequest
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(p) for p in error["loc"])
        raise RequestError(400, f"{param}: {error['msg']} (got {_shown(error.get('input'))})", param) from None
    if isinstance(request, CompletionRequest) and isinstance(request.prompt, list) and len(request.prompt) != 1:
        raise RequestError(400, "prompt: give one prompt per request (a string, or a list of one)", "prompt")
    return request


def to_job(request: ChatRequest | CompletionRequest) -> Job:
    """The generation job of a parsed request."""
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if isinstance(request, ChatRequest):
        prompt: Prompt = [Message(role=m.role, content=m.content) for m in request.messages]
        max_tokens = request.max_completion_tokens or request.max_tokens
    else:
        prompt = request.prompt if isinstance(request.prompt, str) else request.prompt[0]
        max_tokens = request.max_tokens
    return Job(prompt, max_tokens, request.temperature, request.top_p, stop, request.seed)


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

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        if self.endpoint == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        return {**self._envelope(False), "choices": [choice], "usage": usage.to_dict()}

    def chunk(self, text: str | None, finish_reason: str | None = None, *, first: bool = False) -> dict[str, Any]:
        """One streamed piece (``text`` None: an empty delta, with the finish reason)."""
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None}
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
