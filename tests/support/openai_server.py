"""A real local OpenAI-compatible HTTP server for tests: /v1/completions and /v1/chat/completions.

Built on the standard library's ``http.server`` and run in a thread. Replies come from a
generation backend (say, a tiny HF model) or from a plain function of the request; failures can
be injected (``fail_next(429, times=2)``), replies given in the other route's shape (``shape=``)
and delayed, to test retries and timeouts over real sockets. Given an ``api_key``, it answers any
other bearer token (on every route, /v1/models too) as hosted APIs do: HTTP 401
with the key it was given (and the request's path and query) in the message, which lets tests
check that no command repeats them.

Example::

    with OpenAIServer(responder=lambda request: "Problem: ...") as server:
        backend = OpenAIBackend("tiny", EndpointConfig(base_url=server.base_url))
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rayft.generation.backend import GenerationBackend, Prompt, SamplingParams

Responder = Callable[[dict[str, Any]], str]


class OpenAIServer:
    """A thread-backed OpenAI-compatible server on 127.0.0.1 and a free port."""

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        backend: GenerationBackend | None = None,
        delay_s: float = 0.0,
        api_key: str | None = None,
        shape: str | None = None,
    ) -> None:
        if (responder is None) == (backend is None):
            raise ValueError("give exactly one of responder or backend")
        self.responder = responder
        self.backend = backend
        self.delay_s = delay_s
        self.api_key = api_key
        self.shape = shape  # "chat" or "text": every reply in that shape, whatever the route (a server that errs)
        self.requests: list[dict[str, Any]] = []
        self.targets: list[str] = []  # each POST's request target as sent: its path and query
        self.statuses: list[int] = []
        self.connections = 0  # TCP connections accepted (HTTP/1.1 keep-alive lets clients reuse them)
        self._failures: deque[tuple[int, float | None]] = deque()
        self._lock = threading.Lock()
        self._backend_lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rayft-openai-server", daemon=True)

    @property
    def base_url(self) -> str:
        """The URL up to /v1."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> OpenAIServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fail_next(self, status: int, times: int = 1, retry_after_s: float | None = None) -> None:
        """Answer the next ``times`` requests with HTTP ``status`` (and a Retry-After header if given)."""
        with self._lock:
            self._failures.extend([(status, retry_after_s)] * times)

    def clear_failures(self) -> None:
        """Answer every request from now on (drop the failures still queued)."""
        with self._lock:
            self._failures.clear()

    def _next_failure(self) -> tuple[int, float | None] | None:
        with self._lock:
            return self._failures.popleft() if self._failures else None

    def _record(self, request: dict[str, Any], status: int) -> None:
        with self._lock:
            self.requests.append(request)
            self.statuses.append(status)

    def complete(self, request: dict[str, Any], chat: bool) -> dict[str, Any]:
        """The reply body for one request."""
        if self.responder is not None:
            text = self.responder(request)
            prompt_tokens, completion_tokens = len(json.dumps(request).split()), len(text.split())
            finish = "stop"
        else:
            assert self.backend is not None
            prompt: Prompt = request["messages"] if chat else request["prompt"]
            params = SamplingParams(
                max_new_tokens=int(request.get("max_tokens") or 16),
                temperature=float(request.get("temperature") or 0.0),
                top_p=float(request.get("top_p") or 1.0),
                stop=tuple(request.get("stop") or ()),
                seed=request.get("seed"),
            )
            with self._backend_lock:
                (generation,) = self.backend.generate([prompt], params)
            text, prompt_tokens = generation.text, generation.num_prompt_tokens
            completion_tokens, finish = generation.num_generated_tokens, generation.finish_reason
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        as_chat = chat if self.shape is None else self.shape == "chat"
        choice.update({"message": {"role": "assistant", "content": text}} if as_chat else {"text": text})
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": request.get("model", ""),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _handler_for(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do (every reply has a Content-Length)

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server.connections += 1

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet."""

        def do_GET(self) -> None:
            if server.api_key is not None and self._rejected_key(None):
                return
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "rayft-test", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "the body is not JSON"}})
                return
            if server.api_key is not None and self._rejected_key(request):
                return
            routes = {"/v1/completions": False, "/v1/chat/completions": True}
            with server._lock:
                server.targets.append(self.path)
            path = urlsplit(self.path).path
            if path not in routes:
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if server.delay_s:
                time.sleep(server.delay_s)
            failure = server._next_failure()
            if failure is not None:
                status, retry_after = failure
                server._record(request, status)
                headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                self._send(status, {"error": {"message": f"injected HTTP {status}"}}, headers)
                return
            reply = server.complete(request, routes[path])
            server._record(request, 200)
            self._send(200, reply)

        def _rejected_key(self, request: dict[str, Any] | None) -> bool:
            """Answer 401 to a wrong key; a POST's request is recorded (``request`` None: a GET, not recorded)."""
            given = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if given == server.api_key:
                return False
            if request is not None:
                server._record(request, 401)
            message = f"Incorrect API key provided: {given} (request {self.path})"
            self._send(401, {"error": {"message": message, "code": "invalid_api_key"}})
            return True

        def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler
