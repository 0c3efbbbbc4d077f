"""`rayft serve` on the shared local Ray, through the real `openai` client: one application for the module
(a tiny base model and two LoRA adapters on it), every route, streaming, the error cases, and draining."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration

PROMPTS = ["Question: 3 + 4 =", "The quick brown fox"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 7?"}]
SECRET = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two LoRA adapters of the tiny model with different (seeded, large) weights."""
    from tests.support.checkpoints import build_lora_checkpoint

    root = tmp_path_factory.mktemp("adapters")
    return {
        name: build_lora_checkpoint(root / name, tiny_model_dir, seed=seed, scale=0.5)
        for name, seed in (("alpha", 1), ("beta", 2))
    }


@pytest.fixture(scope="module")
def server(ray_session: None, adapters: dict[str, Path]) -> Iterator[rayft.ServeHandle]:
    cfg = RayftConfig.model_validate({"serve": {"max_batch_size": 8, "max_adapters_per_replica": 2, "max_tokens": 8}})
    handle = rayft.api.serve(cfg, [adapters["alpha"], adapters["beta"]], port=0)
    yield handle
    handle.shutdown()


@pytest.fixture(scope="module")
def client(server: rayft.ServeHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=SECRET, max_retries=0, timeout=120) as client:
        yield client


def _stats(server: rayft.ServeHandle) -> dict[str, Any]:
    url = server.base_url.removesuffix("/v1") + "/rayft/stats"
    deployments: list[dict[str, Any]] = httpx.get(url, timeout=60).json()["deployments"]
    return deployments[0]


def _post(server: rayft.ServeHandle, route: str, body: str | dict[str, Any]) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"{server.base_url}/{route}", content=content, headers={"Content-Type": "application/json"},
                      timeout=120)  # fmt: skip


def test_models_lists_the_base_and_both_adapters(
    server: rayft.ServeHandle, client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    base = tiny_model_dir.name
    assert server.model_ids == [base, "alpha", "beta"]
    assert [m.id for m in client.models.list().data] == [base, "alpha", "beta"]
    assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")


def test_chat_completion_uses_the_chat_template_and_counts_tokens(
    server: rayft.ServeHandle, client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    from rayft.config.model import ModelConfig
    from rayft.generation.hf import HFBackend

    reply = client.chat.completions.create(model="alpha", messages=CHAT, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    backend = HFBackend(ModelConfig(name=str(tiny_model_dir)), device="cpu")
    assert reply.object == "chat.completion" and reply.model == "alpha"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens == backend.count_tokens(CHAT)  # type: ignore[arg-type]
    assert 0 < reply.usage.completion_tokens <= 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_text_completion(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="beta", prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert reply.usage is not None and reply.usage.completion_tokens <= 4


def test_streaming_gives_the_same_text_as_a_whole_response(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="alpha", messages=CHAT, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model="alpha", messages=CHAT, max_tokens=6, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    pieces = list(client.completions.create(model="beta", prompt=PROMPTS[1], max_tokens=4, temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices)


def test_two_adapters_answer_differently_on_one_base_loaded_once(
    server: rayft.ServeHandle, client: openai.OpenAI
) -> None:
    base = server.model_ids[0]
    answers = {
        model: client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=8, temperature=0).choices[0].text
        for model in (base, "alpha", "beta", "alpha")
    }
    assert len({answers[base], answers["alpha"], answers["beta"]}) == 3, answers
    stats = _stats(server)
    assert stats["base_loads"] == 1
    assert stats["adapter_loads"] == {"alpha": 1, "beta": 1}


def test_a_replica_serving_adapters_on_an_unquantized_base_never_loads_bitsandbytes(
    server: rayft.ServeHandle, client: openai.OpenAI
) -> None:
    pytest.importorskip("bitsandbytes", reason="the qlora extra: pip install 'rayft[qlora]'")
    from tests.support.ray_state import ray_processes

    client.completions.create(model="alpha", prompt=PROMPTS[0], max_tokens=1)  # PEFT has loaded an adapter
    replicas = ray_processes(":ServeReplica:")  # this test's Ray's, not another's on the machine
    assert replicas
    for replica in replicas:  # bitsandbytes' import loads its native library into the process
        assert "bitsandbytes" not in Path(f"/proc/{replica.pid}/maps").read_text(), replica.cmdline()


def test_greedy_outputs_equal_rayft_generate(server: rayft.ServeHandle, client: openai.OpenAI,
                                             adapters: dict[str, Path], tmp_path: Path) -> None:  # fmt: skip
    source = tmp_path / "prompts.jsonl"
    rows = [{"prompt": PROMPTS[0]}, {"messages": CHAT}, {"prompt": PROMPTS[1]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = RayftConfig.model_validate({"inference": {"temperature": 0, "max_new_tokens": 8}})
    rayft.api.generate(cfg, adapters["beta"], source, tmp_path / "out.jsonl")
    offline = [json.loads(line)["generation"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    served = [
        client.completions.create(model="beta", prompt=PROMPTS[0], max_tokens=8, temperature=0).choices[0].text,
        client.chat.completions.create(model="beta", messages=CHAT, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        .choices[0]
        .message.content,
        client.completions.create(model="beta", prompt=PROMPTS[1], max_tokens=8, temperature=0).choices[0].text,
    ]
    assert served == offline


def test_stop_and_seed(client: openai.OpenAI) -> None:
    full = client.completions.create(model="alpha", prompt=PROMPTS[1], max_tokens=8, temperature=0).choices[0].text
    stop = full[2:4]
    cut = client.completions.create(model="alpha", prompt=PROMPTS[1], max_tokens=8, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = [
        client.completions.create(model="alpha", prompt=PROMPTS[0], max_tokens=8, temperature=1.0, top_p=0.9, seed=7)
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_unknown_model_is_404_naming_the_served_ids(server: rayft.ServeHandle, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gamma", prompt="hi", max_tokens=2)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found" and error["param"] == "model"
    assert all(model_id in error["message"] for model_id in server.model_ids)


@pytest.mark.parametrize(
    ("route", "body", "param", "says"),
    [
        ("chat/completions", "{not json", None, "not valid JSON"),
        ("chat/completions", "[1, 2]", None, "JSON list"),
        ("chat/completions", {"model": "alpha", "messages": CHAT, "max_tokens": "ten"}, "max_tokens", "valid integer"),
        ("chat/completions", {"model": "alpha", "messages": "hello"}, "messages", "valid list"),
        ("completions", {"model": "alpha", "prompt": "hi", "temperature": "hot"}, "temperature", "valid number"),
        ("completions", {"model": "alpha"}, "prompt", "Field required"),
        ("completions", {"model": "alpha", "prompt": "hi", "max_tokens": 0}, "max_tokens", "0 asks for nothing"),
        ("completions", {"model": "alpha", "prompt": "hi", "max_tokens": 5000}, "max_tokens", "ask for at most"),
        ("completions", {"model": "alpha", "prompt": "fox " * 3000}, "prompt", "context is 2048 tokens"),
    ],
)
def test_bad_requests_are_400_with_the_openai_error_shape(
    server: rayft.ServeHandle, route: str, body: str | dict[str, Any], param: str | None, says: str
) -> None:
    response = _post(server, route, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and says in error["message"], error


def test_a_client_that_leaves_mid_stream_frees_its_row(server: rayft.ServeHandle) -> None:
    body = {"model": "alpha", "prompt": PROMPTS[0], "max_tokens": 1500, "temperature": 0, "stream": True}
    before = _stats(server)["cancelled"]
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 60
    while (stats := _stats(server))["rows_in_flight"] or stats["cancelled"] == before:
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    assert stats["cancelled"] == before + 1


def test_no_credential_reaches_a_response_or_the_serve_logs(server: rayft.ServeHandle, client: openai.OpenAI) -> None:
    import ray

    messages = [{"role": "user", "content": f"my token is {SECRET}"}]
    reply = client.chat.completions.with_raw_response.create(model="alpha", messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert SECRET not in reply.text and SECRET not in str(reply.headers)
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    assert not [p for p in logs.rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]


def test_shutdown_drains_requests_in_flight(server: rayft.ServeHandle) -> None:
    """Last: it stops the module's server."""
    body = {"model": "beta", "prompt": PROMPTS[0], "max_tokens": 600, "temperature": 0}
    results: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: results.append(_post(server, "completions", body)))
    thread.start()
    deadline = time.monotonic() + 60
    while not _stats(server)["rows_in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    server.shutdown()
    thread.join(timeout=120)
    assert results and results[0].status_code == 200, results
    assert results[0].json()["usage"]["completion_tokens"] == 600
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.base_url}/models", timeout=5)
