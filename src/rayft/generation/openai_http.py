"""Generation through any OpenAI-compatible HTTP endpoint (vLLM serve, TGI, llama.cpp, hosted APIs).

Chat prompts go to ``/chat/completions``, text prompts to ``/completions``. Requests run with
bounded concurrency (a thread pool of ``max_concurrency``) over one pooled ``httpx`` client per
backend, whose keep-alive connections (at most ``max_concurrency``) are reused across requests and
batches; HTTP 429 and 5xx answers, timeouts and dropped connections are retried with exponential
backoff and jitter (or the server's Retry-After); a prompt that still fails comes back as a
Generation with ``error`` set.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx

from rayft.config.generation import EndpointConfig
from rayft.data.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from rayft.errors import EndpointError
from rayft.generation.backend import (
    FinishReason,
    Generation,
    Prompt,
    SamplingParams,
    prompt_tools,
    truncate_at_stop,
)
from rayft.security import mask_uri, redact, remember_secret

MAX_BACKOFF_S = 30.0


class RetryableError(Exception):
    """A failure worth retrying (429, 5xx, timeout, connection), with the server's suggested delay."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OpenAIBackend:
    """Generates by calling an OpenAI-compatible server; ``model`` is sent as the request's model."""

    def __init__(self, model: str, endpoint: EndpointConfig, *, api_key: str | None = None) -> None:
        self.model = model
        self.endpoint = endpoint
        self.base_url = endpoint.base_url.rstrip("/")
        for value in query_values(self.base_url):
            remember_secret(value)  # a key in the query (?api_key=K) is masked wherever the URL is shown
        key_env = endpoint.api_key_env
        self.api_key = api_key if api_key is not None else (os.environ.get(key_env) if key_env else None)
        remember_secret(self.api_key)  # a server that echoes it back, or a log line, shows it masked
        self._sleep = time.sleep
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A live client (sockets, a lock) does not travel to Ray actors; each process opens its own.
        return {**self.__dict__, "_client": None, "_client_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client_lock=threading.Lock())
        remember_secret(self.api_key)  # in the Ray worker that generates, too

    def client(self) -> httpx.Client:
        """The pooled HTTP client, opened on first use: ``max_concurrency`` keep-alive connections."""
        with self._client_lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
                limit = self.endpoint.max_concurrency
                self._client = httpx.Client(
                    headers=headers,
                    timeout=httpx.Timeout(self.endpoint.timeout_s),
                    limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
                )
                weakref.finalize(self, self._client.close)  # a backend dropped without close() still closes
            return self._client

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    @property
    def name(self) -> str:
        """The endpoint and model, as recorded in provenance."""
        return f"openai:{self.model}@{mask_uri(self.base_url)}"  # kept in every row it writes

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Generation]:
        """One generation per prompt, with at most ``max_concurrency`` requests in flight."""
        if not prompts:
            return []
        workers = min(self.endpoint.max_concurrency, len(prompts))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayft-openai") as pool:
            return list(pool.map(lambda p: self._generate_one(p, params), prompts))

    def _generate_one(self, prompt: Prompt, params: SamplingParams) -> Generation:
        chat = not isinstance(prompt, str)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        body.update({"messages": list(prompt)} if chat else {"prompt": prompt})
        if prompt_tools(prompt):
            body["tools"] = list(prompt_tools(prompt))
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        try:
            reply = self._post_with_retries("/chat/completions" if chat else "/completions", body)
            return _to_generation(reply, chat, params)
        except Exception as exc:  # one failed prompt must not sink the batch
            # a server may quote the request back, the key among it
            return Generation("", finish_reason="error", error=redact(f"{type(exc).__name__}: {exc}"))

    def check_serves_model(self, where: str) -> None:
        """Fail fast, in one line, before any prompt is sent: the server at ``base_url`` answers
        ``GET /models`` with the key given and lists ``model``. ``where`` is the config section that
        holds the endpoint (named in the fix)."""
        shown = mask_uri(self.base_url)
        try:
            response = self._list_models()
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"cannot reach the OpenAI-compatible server at {shown} ({type(exc).__name__}: {redact(str(exc))}); "
                f"start it (rayft serve) or set {where}.base_url to where it listens"
            ) from None
        if response.status_code in (401, 403):
            raise EndpointError(_refused_key_message(shown, response.status_code, self.endpoint.api_key_env,
                                                     bool(self.api_key), where))  # fmt: skip
        if response.status_code != 200:
            raise EndpointError(
                f"the server at {shown} answered GET /models with HTTP {response.status_code} "
                f"({redact(response.text[:200])!r}); check {where}.base_url (it ends in /v1)"
            )
        served = _model_ids(response)
        if self.model not in served:
            raise EndpointError(
                f"the server at {shown} serves no model {self.model!r} (it serves: {', '.join(served) or 'none'}); "
                "pass one of these as the model"
            )

    def _list_models(self) -> httpx.Response:
        """``GET /models``, retried like a request while the server answers 429 or 5xx (busy, or still
        starting); a server nobody listens for fails at once."""
        url = endpoint_url(self.base_url, "/models")
        for attempt in range(self.endpoint.max_retries):
            response = self.client().get(url)
            if response.status_code != 429 and response.status_code < 500:
                return response
            self._sleep(self.backoff_s(attempt, _retry_after(response.headers.get("Retry-After"))))
        return self.client().get(url)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request of any shape (``body`` as the endpoint takes it) to ``path`` under the base URL, retried as
        a generation is; its JSON answer. Raises RuntimeError when it still fails."""
        return self._post_with_retries(path, body)

    def _post_with_retries(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                return self._post(path, body)
            except RetryableError as exc:
                if attempt >= self.endpoint.max_retries:
                    raise RuntimeError(f"{exc} (gave up after {attempt + 1} attempts)") from None
                self._sleep(self.backoff_s(attempt, exc.retry_after_s))
                attempt += 1

    def backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds to wait before retry ``attempt + 1``: Retry-After if given, else doubling with jitter."""
        if retry_after_s is not None:
            return min(MAX_BACKOFF_S, max(0.0, retry_after_s))
        base = float(self.endpoint.backoff_s) * 2.0**attempt
        return min(MAX_BACKOFF_S, base * (0.5 + random.random() / 2))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = endpoint_url(self.base_url, path)
        shown = mask_uri(url)
        try:
            response = self.client().post(url, json=body)
        except httpx.TimeoutException as exc:
            raise RetryableError(f"{type(exc).__name__}: timed out calling {shown}: {exc}") from None
        except httpx.TransportError as exc:
            raise RetryableError(f"{type(exc).__name__} calling {shown}: {exc}") from None
        if response.status_code >= 400:
            message = f"HTTP {response.status_code} from {shown}: {response.text[:300]}"
            if response.status_code == 429 or response.status_code >= 500:
                raise RetryableError(message, _retry_after(response.headers.get("Retry-After")))
            raise RuntimeError(message)
        payload: dict[str, Any] = response.json()
        return payload


def endpoint_url(base_url: str, path: str) -> str:
    """``path`` (``/chat/completions``) appended to the path of ``base_url``, keeping its query and
    fragment: ``https://h/v1?api_key=K`` -> ``https://h/v1/chat/completions?api_key=K``."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + path))


def query_values(url: str) -> list[str]:
    """The values of ``url``'s query parameters (a base URL may carry its key there)."""
    return [value for _, value in parse_qsl(urlsplit(url).query) if value]


def _refused_key_message(shown: str, status: int, key_env: str | None, sent: bool, where: str) -> str:
    """Why the server refused us, never with the key itself: none was sent, or the one sent is not accepted."""
    if not sent:
        variable = f"the environment variable {key_env}" if key_env else f"{where}.api_key_env"
        return f"the server at {shown} needs an API key (HTTP {status}) and none was sent; set {variable} to one"
    fix = f"set the environment variable {key_env} to a key it accepts" if key_env else "pass a key it accepts"
    return f"the server at {shown} refused the API key sent (HTTP {status}); {fix}"


def _model_ids(response: httpx.Response) -> list[str]:
    """The ids of an OpenAI ``/models`` listing (none when the reply is not one)."""
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return []
    return [str(item["id"]) for item in data or [] if isinstance(item, dict) and "id" in item]


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _reply_text(choice: Any, chat: bool) -> str:
    """The text of a reply's first choice, in the shape of the route asked; a reply in another shape (a
    server answering ``/completions`` as a chat) is an error, never an empty generation."""
    route = "/chat/completions" if chat else "/completions"
    if not isinstance(choice, dict):
        raise ValueError(f"the server answered {route} with a choice that is no object: {json.dumps(choice)[:200]}")
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    raw = content if chat else choice.get("text")
    if isinstance(raw, str) or (chat and isinstance(message, dict) and "content" in message and raw is None):
        return raw or ""  # a chat reply whose content is null (say, tool calls only) has no text
    if chat and isinstance(choice.get("text"), str):
        shape = "the text shape (choices[0].text, no choices[0].message.content)"
    elif not chat and isinstance(message, dict):
        shape = "the chat shape (choices[0].message, no choices[0].text)"
    else:
        shape = f"an unknown shape ({json.dumps(choice)[:200]})"
    raise ValueError(
        f"the server answered {route} in {shape}; it does not follow the OpenAI API for that route: send "
        f"{'text prompts' if chat else 'chat prompts (messages)'} instead, or use a server that serves {route}"
    )


def _calls_text(choice: dict[str, Any]) -> str:
    """A chat reply's ``tool_calls`` in the default text format, after its text (so that a generation reads
    as a local model's output with the same calls: environments and records parse the one format)."""
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    blocks = []
    for call in calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):  # arguments as the API gives them, JSON text: the parser reads either
            body = json.dumps(
                {"name": function.get("name"), "arguments": function.get("arguments")}, ensure_ascii=False
            )
            blocks.append(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}")
    return "".join("\n" + block for block in blocks)


def _to_generation(reply: dict[str, Any], chat: bool, params: SamplingParams) -> Generation:
    choices = reply.get("choices") or []
    if not choices:
        raise ValueError(f"the reply has no choices: {json.dumps(reply)[:200]}")
    choice = choices[0]
    raw = _reply_text(choice, chat) + _calls_text(choice)
    text, stopped = truncate_at_stop(raw, params.stop)
    finish: FinishReason = "length" if choice.get("finish_reason") == "length" and not stopped else "stop"
    usage = reply.get("usage") or {}
    return Generation(
        text,
        num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
        num_generated_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason=finish,
    )
