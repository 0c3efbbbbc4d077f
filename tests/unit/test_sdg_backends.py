"""Generation backends for SDG teachers: the OpenAI-compatible HTTP client against a real local server,
and the vLLM backend's install hint and parameter mapping (vLLM itself needs a GPU)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rayft.config.generation import EndpointConfig, GenerationConfig
from rayft.data.tools import parse_tool_calls
from rayft.errors import MissingDependencyError
from rayft.generation import openai_http
from rayft.generation.backend import SamplingParams, ToolChat
from rayft.generation.factory import build_backend
from rayft.generation.openai_http import OpenAIBackend
from tests.support.openai_server import OpenAIServer

FAST = {"backoff_s": 0.01, "timeout_s": 5.0}


def echo(request: dict[str, Any]) -> str:
    source = request["messages"][-1]["content"] if "messages" in request else request["prompt"]
    return f"echo: {source} STOP tail"


def test_chat_and_text_prompts_round_trip_with_usage_and_stop() -> None:
    with OpenAIServer(responder=echo) as server:
        backend = OpenAIBackend("teacher", EndpointConfig(base_url=server.base_url, **FAST), api_key="k")
        params = SamplingParams(max_new_tokens=8, stop=(" STOP",))
        chat, text = backend.generate([[{"role": "user", "content": "hi"}], "plain"], params)
    assert (chat.text, text.text) == ("echo: hi", "echo: plain")
    assert chat.error is None and chat.num_generated_tokens > 0 and chat.finish_reason == "stop"
    assert server.requests[0]["model"] == "teacher" and server.requests[0]["stop"] == [" STOP"]
    assert {"messages", "prompt"} == {k for r in server.requests for k in r if k in ("messages", "prompt")}
    assert backend.name == f"openai:teacher@{server.base_url}"


def test_a_base_url_with_a_query_gets_the_route_before_it_and_never_shows_the_key() -> None:
    # The docs' form of a key carried in the URL: the route goes on the path, the query stays.
    with OpenAIServer(responder=echo) as server:
        backend = OpenAIBackend("m", EndpointConfig(base_url=f"{server.base_url}/?api_key=SeCrEt-K&x=1", **FAST))
        chat, text = backend.generate([[{"role": "user", "content": "hi"}], "plain"], SamplingParams())
        server.fail_next(400)
        (failed,) = backend.generate(["plain"], SamplingParams())
    assert (chat.text, text.text) == ("echo: hi STOP tail", "echo: plain STOP tail")
    assert sorted(server.targets[:2]) == ["/v1/chat/completions?api_key=SeCrEt-K&x=1",
                                          "/v1/completions?api_key=SeCrEt-K&x=1"]  # fmt: skip
    assert failed.error is not None and "HTTP 400 from http://" in failed.error
    assert "SeCrEt-K" not in failed.error and "SeCrEt-K" not in backend.name


def test_429_and_5xx_are_retried_until_success() -> None:
    with OpenAIServer(responder=echo) as server:
        server.fail_next(429, times=2)
        server.fail_next(503)
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, max_retries=3, **FAST))
        (gen,) = backend.generate(["x"], SamplingParams())
    assert gen.error is None and gen.text == "echo: x STOP tail"
    assert server.statuses == [429, 429, 503, 200]


def test_a_prompt_that_keeps_failing_comes_back_with_an_error_not_an_exception() -> None:
    with OpenAIServer(responder=echo) as server:
        server.fail_next(500, times=10)
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, max_retries=2, **FAST))
        (gen,) = backend.generate(["x"], SamplingParams())
    assert gen.finish_reason == "error" and gen.text == ""
    assert "HTTP 500" in (gen.error or "") and "after 3 attempts" in (gen.error or "")
    assert server.statuses == [500, 500, 500]


@pytest.mark.parametrize(("shape", "prompt", "said"), [
    ("chat", "plain", "answered /completions in the chat shape (choices[0].message, no choices[0].text)"),
    ("text", [{"role": "user", "content": "hi"}],
     "answered /chat/completions in the text shape (choices[0].text, no choices[0].message.content)"),
])  # fmt: skip
def test_a_reply_in_the_other_routes_shape_is_an_error_not_an_empty_generation(
    shape: str, prompt: Any, said: str
) -> None:
    with OpenAIServer(responder=echo, shape=shape) as server:
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, **FAST))
        (gen,) = backend.generate([prompt], SamplingParams())
    assert gen.finish_reason == "error" and gen.text == ""
    assert said in (gen.error or ""), gen.error


def test_client_errors_are_not_retried() -> None:
    with OpenAIServer(responder=echo) as server:
        server.fail_next(400)
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, max_retries=5, **FAST))
        (gen,) = backend.generate(["x"], SamplingParams())
    assert "HTTP 400" in (gen.error or "") and server.statuses == [400]


def test_a_slow_server_times_out_instead_of_hanging() -> None:
    with OpenAIServer(responder=echo, delay_s=1.0) as server:
        endpoint = EndpointConfig(base_url=server.base_url, timeout_s=0.2, max_retries=1, backoff_s=0.01)
        started = time.monotonic()
        (gen,) = OpenAIBackend("m", endpoint).generate(["x"], SamplingParams())
    assert gen.finish_reason == "error" and "timed out" in (gen.error or "")
    assert time.monotonic() - started < 3


def test_unreachable_endpoint_is_an_error_per_prompt() -> None:
    endpoint = EndpointConfig(base_url="http://127.0.0.1:9/v1", max_retries=1, backoff_s=0.01, timeout_s=1)
    gens = OpenAIBackend("m", endpoint).generate(["a", "b"], SamplingParams())
    assert all(g.finish_reason == "error" and "ConnectError" in (g.error or "") for g in gens)


def test_concurrency_is_bounded() -> None:
    active, peak, lock = 0, 0, threading.Lock()

    def slow(request: dict[str, Any]) -> str:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1
        return "ok"

    with OpenAIServer(responder=slow) as server:
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, max_concurrency=3, **FAST))
        gens = backend.generate([str(i) for i in range(12)], SamplingParams())
    assert [g.text for g in gens] == ["ok"] * 12
    assert 1 < peak <= 3


def test_connections_are_pooled_and_reused() -> None:
    with OpenAIServer(responder=echo) as server:
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, max_concurrency=3, **FAST))
        try:
            first = backend.generate([str(i) for i in range(12)], SamplingParams())
            second = backend.generate([str(i) for i in range(12)], SamplingParams())
        finally:
            backend.close()
    assert all(g.error is None for g in first + second)
    assert len(server.requests) == 24
    assert 1 <= server.connections <= 3  # one connection per request without pooling


def test_backoff_doubles_with_jitter_and_follows_retry_after() -> None:
    backend = OpenAIBackend("m", EndpointConfig(backoff_s=1.0))
    assert backend.backoff_s(0, 2.5) == 2.5
    for attempt in range(4):
        assert 2**attempt * 0.5 <= backend.backoff_s(attempt, None) <= 2**attempt
    assert backend.backoff_s(20, None) == 30.0


def test_openai_backend_is_built_from_config() -> None:
    cfg = GenerationConfig.model_validate(
        {"backend": "openai", "model": {"name": "gpt-x"}, "endpoint": {"base_url": "http://h:1/v1/"}}
    )
    backend = build_backend(cfg)
    assert backend.name == "openai:gpt-x@http://h:1/v1"


def test_vllm_backend_says_how_to_install_it() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    with pytest.raises(MissingDependencyError, match=r"pip install 'rayft\[vllm\]'"):
        build_backend(GenerationConfig(backend="vllm"))


def test_vllm_sampling_parameters_map_ours() -> None:
    from rayft.generation.vllm import vllm_sampling_kwargs

    assert vllm_sampling_kwargs(SamplingParams(max_new_tokens=7, temperature=0.0, top_p=0.5)) == {
        "max_tokens": 7,
        "temperature": 0.0,
        "top_p": 1.0,
    }
    sampled = vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, stop=("\n\n",), seed=3))
    assert sampled["stop"] == ["\n\n"] and sampled["seed"] == 3 and sampled["top_p"] == 0.9


def test_a_tool_chat_sends_its_tools_and_a_replys_tool_calls_come_back_in_the_default_format() -> None:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    with OpenAIServer(responder=echo) as server:
        backend = OpenAIBackend("m", EndpointConfig(base_url=server.base_url, **FAST))
        backend.generate([ToolChat([{"role": "user", "content": "hi"}], [tool]), [{"role": "user", "content": "x"}]],
                         SamplingParams())  # fmt: skip
    with_tools, plain = sorted(server.requests, key=lambda r: "tools" not in r)
    assert with_tools["tools"] == [tool] and "tools" not in plain
    calls = [{"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    choice = {"message": {"role": "assistant", "content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}
    reply = {"choices": [choice], "usage": {"completion_tokens": 5}}
    generation = openai_http._to_generation(reply, True, SamplingParams())
    (parsed,) = parse_tool_calls(generation.text)
    assert (parsed.name, parsed.arguments) == ("add", {"a": 1}) and generation.num_generated_tokens == 5
