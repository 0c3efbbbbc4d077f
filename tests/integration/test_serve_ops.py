"""Operating `rayft serve` on the shared local Ray, through the real `openai` client: Prometheus `/metrics` per
model and adapter (parsed by promtool and by prometheus_client's parser, its series moving under load), and
LoRA adapters loaded and unloaded at run time (from a directory and from S3 through rayft's storage layer, a
least-recently-used limit, bad input as a 400). One application for the module, with an API key."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration

KEY = "sk-rayft-" + "Op5ops7Key9Xq2Lm4Nb6Vc8Zx"
PROMPT = "The quick brown fox"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``alpha`` (served from the start), ``same`` (a copy of alpha's directory), ``other`` (other weights), and
    ``wide``: an adapter of a tiny model twice as wide, which does not fit this base."""
    from rayft.testing import build_tiny_model
    from tests.support.checkpoints import build_lora_checkpoint

    root = tmp_path_factory.mktemp("ops-adapters")
    built = {name: build_lora_checkpoint(root / name, tiny_model_dir, seed=seed, scale=0.5)
             for name, seed in (("alpha", 1), ("other", 2))}  # fmt: skip
    built["same"] = Path(shutil.copytree(built["alpha"], root / "same"))
    wide_base = build_tiny_model(root / "wide-base", hidden_size=64)
    built["wide"] = build_lora_checkpoint(root / "wide", wide_base, seed=3, scale=0.5)
    return built


@pytest.fixture(scope="module")
def server(
    ray_session: None, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[rayft.ServeHandle]:
    keys = tmp_path_factory.mktemp("ops-keys") / "api-keys"
    keys.write_text(KEY + "\n", encoding="utf-8")
    settings = {"max_batch_size": 8, "max_tokens": 8, "max_runtime_adapters": 2, "api_keys_file": str(keys)}
    cfg = RayftConfig.model_validate({"serve": settings})
    with rayft.api.serve(cfg, [adapters["alpha"]], port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server: rayft.ServeHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120) as client:
        yield client


def _get(server: rayft.ServeHandle, route: str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(server.base_url.removesuffix("/v1") + route, headers=headers, timeout=60)


def _admin(server: rayft.ServeHandle, route: str, body: dict[str, Any] | str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, str) else {"json": body}
    return httpx.post(f"{server.base_url}/{route}", headers=headers, timeout=120, **kwargs)


def _scrape(server: rayft.ServeHandle) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """The exposition text, and every sample by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = _get(server, "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _greedy(client: openai.OpenAI, model: str) -> str:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="needs promtool (Debian's prometheus): apt-get install -y "
                    "prometheus")  # fmt: skip
def test_metrics_pass_promtool_and_move_under_load(server: rayft.ServeHandle, client: openai.OpenAI) -> None:
    base = server.model_ids[0]
    _, before = _scrape(server)
    usages = [client.completions.create(model=m, prompt=PROMPT, max_tokens=6, temperature=0).usage
              for m in (base, "alpha", "alpha")]  # fmt: skip
    stream = client.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                            stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nobody", prompt=PROMPT, max_tokens=2)
    text, after = _scrape(server)
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                             check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    alpha, plain = {"model": base, "adapter": "alpha"}, {"model": base, "adapter": ""}
    assert delta("rayft_serve_requests_total", **alpha, status="200") == 3  # two completions and the stream
    assert delta("rayft_serve_requests_total", **plain, status="200") == 1
    assert delta("rayft_serve_requests_total", model="", adapter="", status="404") == 1
    assert delta("rayft_serve_request_errors_total", model="", adapter="", code="model_not_found") == 1
    streamed = chunks[-1].usage
    assert streamed is not None and all(u is not None for u in usages)
    generated = sum(u.completion_tokens for u in usages[1:] if u) + streamed.completion_tokens
    assert delta("rayft_serve_generation_tokens_total", **alpha) == generated
    assert delta("rayft_serve_prompt_tokens_total", **alpha) == sum(u.prompt_tokens for u in usages[1:] if u) + (
        streamed.prompt_tokens)  # fmt: skip
    assert delta("rayft_serve_generation_tokens_total", **plain) == usages[0].completion_tokens  # type: ignore[union-attr]
    assert delta("rayft_serve_time_to_first_token_seconds_count", **alpha) == 3
    assert delta("rayft_serve_request_latency_seconds_count", **alpha) == 3
    # Every completion after its first piece adds one gap per further piece: at most its tokens less one.
    gaps = delta("rayft_serve_time_between_tokens_seconds_count", **alpha)
    assert 0 < gaps <= generated - 3
    assert delta("rayft_serve_request_latency_seconds_sum", **alpha) > delta(
        "rayft_serve_time_to_first_token_seconds_sum", **alpha)  # fmt: skip
    for name in ("rayft_serve_queue_depth", "rayft_serve_running_requests"):
        assert (name, tuple(sorted(plain.items()))) in after, name
    assert 0 <= _value(after, "rayft_serve_kv_cache_usage_ratio", model=base) <= 1


def test_load_gauges_see_a_burst_while_it_runs(server: rayft.ServeHandle, client: openai.OpenAI) -> None:
    """Eight streams of 128 tokens: once each has sent its first chunk all eight are running rows, and a
    scrape then counts them (the tiny model decodes ~128 steps of 8 rows in well over the scrape's time)."""
    started, release, done = threading.Barrier(9), threading.Event(), []

    def one(index: int) -> None:
        stream = client.completions.create(model="alpha", prompt=f"{PROMPT} {index}", max_tokens=128,
                                           temperature=0, stream=True)  # fmt: skip
        iterator = iter(stream)
        next(iterator)
        started.wait(timeout=120)
        release.wait(timeout=120)
        done.append(sum(1 for _ in iterator))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait(timeout=120)
    _, samples = _scrape(server)
    release.set()
    for thread in threads:
        thread.join(timeout=120)
    base = server.model_ids[0]
    running = _value(samples, "rayft_serve_running_requests", model=base, adapter="alpha")
    waiting = _value(samples, "rayft_serve_queue_depth", model=base, adapter="alpha")
    assert running + waiting >= 1 and running <= 8, (running, waiting)
    assert _value(samples, "rayft_serve_kv_cache_usage_ratio", model=base) > 0
    assert len(done) == 8


def test_metrics_and_admin_routes_need_the_key(server: rayft.ServeHandle) -> None:
    assert _get(server, "/metrics", key=None).status_code == 401
    refused = _admin(server, "load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}, key="wrong")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert _admin(server, "unload_lora_adapter", {"lora_name": "x"}, key=None).status_code == 401


def test_an_adapter_loaded_at_run_time_serves_as_the_same_one_given_at_start(
    server: rayft.ServeHandle, client: openai.OpenAI, adapters: dict[str, Path]
) -> None:
    if "same" in [m.id for m in client.models.list().data]:  # loaded by the eviction test, run first
        assert _admin(server, "unload_lora_adapter", {"lora_name": "same"}).status_code == 200
    loaded = _admin(server, "load_lora_adapter", {"lora_name": "same", "lora_path": str(adapters["same"])})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["base_model"] == server.model_ids[0] and loaded.json()["evicted"] == []
    assert "same" in [m.id for m in client.models.list().data]
    base = _greedy(client, server.model_ids[0])
    _, before = _scrape(server)
    assert _greedy(client, "same") == _greedy(client, "alpha") != base  # alpha's weights, not the base's
    again = _admin(server, "load_lora_adapter", {"lora_name": "same", "lora_path": str(adapters["other"])})
    assert again.status_code == 400 and "is loaded already; unload it first" in again.json()["error"]["message"]
    _, after = _scrape(server)
    same = {"model": server.model_ids[0], "adapter": "same", "status": "200"}
    assert (
        _value(after, "rayft_serve_requests_total", **same) - _value(before, "rayft_serve_requests_total", **same) == 1
    )


def test_an_adapter_from_s3_loads_and_the_least_recently_used_is_evicted(
    server: rayft.ServeHandle, client: openai.OpenAI, adapters: dict[str, Path]
) -> None:
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
    from rayft.runs.remote import RemoteRun
    from tests.support.object_store import DUMMY_SECRET_KEY, local_s3_server

    base = server.model_ids[0]
    with local_s3_server() as s3:
        RemoteRun(s3.bucket_uri("adapters")).upload_tree(adapters["other"], "other")
        uri = s3.bucket_uri("adapters", "other", create=False)
        if "same" not in [m.id for m in client.models.list().data]:  # run alone: the limit's first adapter
            assert _admin(server, "load_lora_adapter", {"lora_name": "same", "lora_path": str(adapters["same"])}
                          ).status_code == 200  # fmt: skip
        loaded = _admin(server, "load_lora_adapter", {"lora_name": "remote", "lora_path": uri})
        assert loaded.status_code == 200 and loaded.json()["evicted"] == [], loaded.text
        assert DUMMY_SECRET_KEY not in loaded.text
        remote = _greedy(client, "remote")
    assert remote not in (_greedy(client, base), _greedy(client, "alpha"))
    _greedy(client, "same")  # "same" is now used more recently than "remote"
    third = _admin(server, "load_lora_adapter", {"lora_name": "third", "lora_path": str(adapters["other"])})
    assert third.status_code == 200 and third.json()["evicted"] == ["remote"], third.text
    served = [m.id for m in client.models.list().data]
    assert "remote" not in served and {"same", "third", "alpha"} <= set(served)
    with pytest.raises(openai.NotFoundError):
        _greedy(client, "remote")
    assert _greedy(client, "third") == remote  # the same weights, from a directory this time
    assert _admin(server, "unload_lora_adapter", {"lora_name": "third"}).status_code == 200
    assert "third" not in [m.id for m in client.models.list().data]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"lora_name": "ghost", "lora_path": "/nowhere/adapter"}, "lora_path /nowhere/adapter does not exist"),
        ({"lora_name": "model", "lora_path": "{model}"}, "is not a LoRA adapter: no readable adapter_config"),
        ({"lora_name": "wide", "lora_path": "{wide}"}, "does not fit the base model"),
        ({"lora_name": "x"}, "lora_path must be a non-empty string"),
        ("{not json", "takes a JSON object"),
        ({"lora_name": "alpha", "lora_path": "{wide}"}, "'alpha' was given at start"),
    ],
)
def test_bad_adapters_are_a_400_in_openai_shape(
    server: rayft.ServeHandle, client: openai.OpenAI, adapters: dict[str, Path], *, tiny_model_dir: Path,
    body: dict[str, str] | str, message: str,
) -> None:  # fmt: skip
    if isinstance(body, dict):
        body = {k: v.format(model=tiny_model_dir, wide=adapters["wide"]) for k, v in body.items()}
    answer = _admin(server, "load_lora_adapter", body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and message in error["message"], error
    assert "Traceback" not in answer.text and "\n" not in error["message"]
    assert _greedy(client, "alpha")  # the server serves on, its base unchanged by the refused adapter


def test_unloading_what_cannot_be_unloaded(server: rayft.ServeHandle) -> None:
    given = _admin(server, "unload_lora_adapter", {"lora_name": "alpha"})
    assert given.status_code == 400 and "was given at start" in given.json()["error"]["message"]
    unknown = _admin(server, "unload_lora_adapter", {"lora_name": "nobody"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_every_dashboard_query_finds_the_servers_series_in_prometheus(
    server: rayft.ServeHandle, client: openai.OpenAI, tmp_path: Path
) -> None:
    """A real Prometheus scrapes the server's /metrics (with the key) every 0.2 s while it serves; every PromQL
    expression of deploy/monitoring/rayft-serving.json, its pickers set to all, returns series."""
    import json
    import time
    import urllib.parse

    from tests.support.servers import have_prometheus, prometheus_server

    if not have_prometheus():
        pytest.skip("needs Debian's prometheus: apt-get install -y prometheus")
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy/monitoring/rayft-serving.json").read_text())
    exprs = {t["expr"].replace("$model", ".*").replace("$adapter", ".*").replace("$__rate_interval", "5s")
             for p in dashboard["panels"] for t in p["targets"]}  # fmt: skip
    target = server.base_url.removeprefix("http://").removesuffix("/v1")
    with prometheus_server(tmp_path / "prom", [target], scrape_interval_s=0.2, bearer_token=KEY) as prom:
        missing, deadline = set(exprs), time.monotonic() + 40
        while missing and time.monotonic() < deadline:
            with pytest.raises(openai.NotFoundError):  # an error for the errors panel
                client.completions.create(model="nobody", prompt=PROMPT, max_tokens=2)
            _greedy(client, "alpha")
            for expr in sorted(missing):
                reply = httpx.get(f"{prom.uri}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=30)
                assert reply.status_code == 200, (expr, reply.text)
                if reply.json()["data"]["result"]:
                    missing.discard(expr)
    assert not missing, f"no series for: {sorted(missing)}"
