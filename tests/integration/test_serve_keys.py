"""`rayft serve` with API keys (from a key file): 401 in OpenAI's shape without one of them, served with one;
no key in a response, in the Serve logs or on the console; `/health` open to probes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

import rayft
from rayft.config import RayftConfig

pytestmark = pytest.mark.integration

KEY = "sk-rayft-" + "Zq8xW3vB1nM4kL7pR2tY5uI0"


@pytest.fixture(scope="module")
def server(
    ray_session: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[rayft.ServeHandle]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"sk-other-key\n{KEY}\n", encoding="utf-8")
    cfg = RayftConfig.model_validate({"serve": {"max_tokens": 4, "api_keys_file": str(keys)}})
    with rayft.api.serve(cfg, [tiny_model_dir], port=0) as handle:
        yield handle


def test_requests_need_one_of_the_keys(server: rayft.ServeHandle, capfd: pytest.CaptureFixture[str]) -> None:
    import ray

    model = server.model_ids[0]
    for api_key in ("wrong-key", "sk-other"):
        with openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as caught:
                client.completions.create(model=model, prompt="hi", max_tokens=2)
            error = caught.value.body
            assert isinstance(error, dict) and error["type"] == "authentication_error"
            assert error["code"] == "invalid_api_key" and api_key not in error["message"]
    bare = httpx.get(f"{server.base_url}/models", timeout=30)
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    assert set(bare.json()["error"]) == {"message", "type", "param", "code"}
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
        assert [m.id for m in client.models.list().data] == server.model_ids
        reply = client.completions.with_raw_response.create(model=model, prompt="hi", max_tokens=2)
        assert reply.status_code == 200 and KEY not in reply.text
    health = httpx.get(server.base_url.removesuffix("/v1") + "/health", timeout=30)
    assert health.status_code == 200  # probes carry no key
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    assert not [p for p in logs.rglob("*") if p.is_file() and KEY in p.read_text(errors="replace")]
    console = capfd.readouterr()
    assert KEY not in console.out + console.err
    assert "POST /v1/completions" not in console.out + console.err  # the access log stays in the Serve log files
    serve_logs = "".join(p.read_text(errors="replace") for p in (logs / "serve").glob("*.log"))
    assert "POST /v1/completions" in serve_logs


def test_health_is_503_until_every_model_is_loaded(server: rayft.ServeHandle, tiny_model_dir: Path) -> None:
    """A second application on the same Serve whose model replica cannot be placed (more CPUs than the test
    Ray has): its router is up, its model never loads, and /health says so until the model answers."""
    from ray import serve

    from rayft.config.model import ModelConfig
    from rayft.config.serve import ServeConfig
    from rayft.serving.app import build_application
    from rayft.serving.plan import plan_serving

    plan = plan_serving([str(tiny_model_dir)], ModelConfig())
    unplaceable = ServeConfig(num_cpus_per_replica=64)
    serve._run(build_application(plan, unplaceable), name="loading", route_prefix="/loading", _blocking=False)
    try:
        url = server.base_url.removesuffix("/v1") + "/loading/health"
        response = httpx.get(url, timeout=60)
        while response.status_code == 404:  # the proxy learns the new route
            response = httpx.get(url, timeout=60)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_ready" and tiny_model_dir.name in error["message"]
        assert response.headers["retry-after"] == "2"
    finally:
        serve.delete("loading")
