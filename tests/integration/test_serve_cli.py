"""`rayft serve` through its real command line, each with the Ray it starts: SIGTERM (what Kubernetes and
systemd send) and SIGINT to a server started in the background by a script both drain the streams in
flight, exit 0 and leave no Ray process; a busy port is a one-line error."""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

pytestmark = pytest.mark.integration

STREAMS = 4
TOKENS = 400
START_TIMEOUT_S = 240


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray, not the tests' one
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path)}


def _command(model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rayft", "serve", str(model), "--port", "0", *extra]


def _lines(stream: Any) -> queue.Queue[str | None]:
    """The stream's lines as they come (None at its end), read on a thread so no read can hang the test."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _serving_url(lines: queue.Queue[str | None], seen: list[str]) -> str:
    while (line := lines.get(timeout=START_TIMEOUT_S)) is not None:
        seen.append(line)
        if line.startswith("Serving at "):
            return line.removeprefix("Serving at ").strip()
    raise AssertionError("rayft serve ended before serving:\n" + "".join(seen))


def _stream(url: str, model: str, started: threading.Event, results: list[dict[str, Any]]) -> None:
    body = {"model": model, "prompt": "The quick brown fox", "max_tokens": TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
                started.set()
            elif line == "data: [DONE]":
                events.append({"done": True})
    results.append({"status": response.status_code, "events": events})


def _serve_and_stop(command: list[str], signum: int, *, background: bool, model_id: str) -> None:
    script = ["bash", "-c", f"{shlex.join(command)} & wait $!"] if background else command
    with subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()) as proc:
        assert proc.stdout is not None
        seen: list[str] = []
        url = _serving_url(_lines(proc.stdout), seen)
        server = psutil.Process(proc.pid).children()[0] if background else psutil.Process(proc.pid)
        ray_processes = server.children(recursive=True)
        assert ray_processes, "rayft serve started no Ray of its own"
        started = [threading.Event() for _ in range(STREAMS)]
        results: list[dict[str, Any]] = []
        threads = [threading.Thread(target=_stream, args=(url, model_id, s, results)) for s in started]
        for thread in threads:
            thread.start()
        for event in started:
            assert event.wait(timeout=120), "a stream did not start"
        server.send_signal(signum)
        for thread in threads:
            thread.join(timeout=300)
        code = proc.wait(timeout=120)
    assert code == 0, "".join(seen) + (proc.stdout.read() if proc.stdout else "")
    assert len(results) == STREAMS
    for result in results:
        events = result["events"]
        assert result["status"] == 200 and events[-1] == {"done": True}
        assert events[-2]["usage"]["completion_tokens"] == TOKENS  # every stream ran to its end
    left = [p for p in ray_processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.name() for p in left]


def test_sigterm_drains_four_streams_and_exits_0(tiny_model_dir: Path) -> None:
    _serve_and_stop(_command(tiny_model_dir), signal.SIGTERM, background=False, model_id=tiny_model_dir.name)


def test_sigint_stops_a_server_a_script_started_in_the_background(tiny_model_dir: Path) -> None:
    _serve_and_stop(_command(tiny_model_dir), signal.SIGINT, background=True, model_id=tiny_model_dir.name)


def test_a_busy_port_or_a_bad_one_is_a_one_line_error(tiny_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*_command(tiny_model_dir)[:-2], "--port", str(port)], capture_output=True,
                              text=True, env=_env(), timeout=START_TIMEOUT_S, check=False)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr + done.stdout
    assert f"Error: cannot listen on 127.0.0.1:{port}" in done.stderr and "choose another --port" in done.stderr
    bad = subprocess.run([*_command(tiny_model_dir)[:-2], "--port", "70000"], capture_output=True, text=True,
                         env=_env(), timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2 and "70000 is not in the range 0<=x<=65535" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_while_draining_new_requests_get_a_503_and_a_stream_cut_ends_with_an_error_event(tiny_model_dir: Path) -> None:
    """SIGTERM with a stream longer than the drain: /health and a new request get OpenAI's error shape, 503 with
    a Retry-After (not Serve's plain-text 404); the stream's last event says it was cut (no [DONE]); the
    console shows rayft's lines only (none of Ray's, such as its controller's failed shutdown task)."""
    command = _command(tiny_model_dir, "serve.graceful_shutdown_timeout_s=2")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()) as proc:
        assert proc.stdout is not None
        seen: list[str] = []
        lines = _lines(proc.stdout)
        url = _serving_url(lines, seen)
        started, results = threading.Event(), []
        body = {"model": tiny_model_dir.name, "prompt": "The quick brown fox", "max_tokens": 2000, "temperature": 0,
                "stream": True}  # fmt: skip
        stream = threading.Thread(target=_raw_stream, args=(url, body, started, results))
        stream.start()
        assert started.wait(timeout=120), "the stream did not start"
        proc.send_signal(signal.SIGTERM)
        health = _until_refused(f"{url.removesuffix('/v1')}/health")
        late = httpx.post(f"{url}/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
        stream.join(timeout=120)
        code = proc.wait(timeout=120)
        while (line := lines.get(timeout=30)) is not None:
            seen.append(line)
    console = "".join(seen)
    assert code == 0, console
    for answer in (health, late):
        assert answer.status_code == 503 and int(answer.headers["Retry-After"]) >= 1, answer.text
        assert answer.json()["error"]["code"] == "server_shutting_down", answer.text
    [events] = results
    assert events[-1] != "data: [DONE]" and "[DONE]" not in events, events[-3:]
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "server_shutting_down", last
    assert "stopped 1 stream(s) still running after 2 s" in console, console
    assert "(raylet)" not in console and "graceful_shutdown failed" not in console, console


def _raw_stream(url: str, body: dict[str, Any], started: threading.Event, results: list[list[str]]) -> None:
    events: list[str] = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                started.set()
    results.append(events)


def _until_refused(url: str) -> httpx.Response:
    """GET ``url`` until the server answers other than 200 (the drain has begun): that answer."""
    for _ in range(600):
        answer = httpx.get(url, timeout=30)
        if answer.status_code != 200:
            return answer
        threading.Event().wait(0.05)
    raise AssertionError(f"{url} still answered 200 after the stop signal")
