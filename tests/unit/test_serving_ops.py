"""Server operations without a server: the metrics' exposition (promtool and prometheus_client's parser), the
runtime adapters' bodies, least-recently-used order and checks of an adapter directory (a real PEFT adapter of
the tiny model, a file:// URI through rayft's storage layer)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rayft.serving.adapters import (
    RuntimeAdapters,
    adapter_files,
    check_adapter_dir,
    check_fits,
    local_adapter_dir,
    parse_load,
    parse_unload,
)
from rayft.serving.metrics import ServeMetrics
from rayft.serving.protocol import RequestError

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _samples(metrics: ServeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    body, _ = metrics.exposition()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples}  # fmt: skip


def test_a_request_timer_records_each_figure_once_under_its_labels() -> None:
    metrics = ServeMetrics()
    timer = metrics.timer("", None)
    timer.relabel("base", "alpha")
    for _ in range(4):
        timer.piece()
    timer.tokens(10, 4)
    timer.done(200)
    timer.done(499, {"code": "client_closed_request"})  # after the end: ignored
    silent = metrics.timer("base", "beta")  # its first token was the end of sequence: its end is its first token
    silent.event(end=True)
    silent.event(end=True)
    failed = metrics.timer("base", None)
    failed.done(400, {"type": "invalid_request_error", "code": None})
    samples = _samples(metrics)
    alpha = (("adapter", "alpha"), ("model", "base"))
    assert samples[("rayft_serve_requests_total", (*alpha, ("status", "200")))] == 1
    assert ("rayft_serve_requests_total", (*alpha, ("status", "499"))) not in samples
    assert samples[("rayft_serve_time_to_first_token_seconds_count", alpha)] == 1
    assert samples[("rayft_serve_time_between_tokens_seconds_count", alpha)] == 3  # four pieces, three gaps
    assert samples[("rayft_serve_prompt_tokens_total", alpha)] == 10
    assert samples[("rayft_serve_generation_tokens_total", alpha)] == 4
    assert samples[("rayft_serve_time_to_first_token_seconds_count", (("adapter", "beta"), ("model", "base")))] == 1
    base = (("adapter", ""), ("model", "base"))
    assert samples[("rayft_serve_request_errors_total", tuple(sorted((*base, ("code", "invalid_request_error")))))] == 1


def test_load_gauges_follow_the_replicas_report_and_pass_promtool() -> None:
    metrics = ServeMetrics()
    report = {"waiting": {"alpha": 2}, "running": {"": 1, "alpha": 3}, "kv_reserved": 512, "kv_capacity": 2048,
              "adapters_loaded": 1}  # fmt: skip
    metrics.set_load("base", report)
    metrics.set_load("base", {**report, "waiting": {}, "running": {"": 1}})  # alpha's requests ended
    samples = _samples(metrics)
    assert samples[("rayft_serve_running_requests", (("adapter", "alpha"), ("model", "base")))] == 0
    assert samples[("rayft_serve_queue_depth", (("adapter", "alpha"), ("model", "base")))] == 0
    assert samples[("rayft_serve_running_requests", (("adapter", ""), ("model", "base")))] == 1
    assert samples[("rayft_serve_kv_cache_usage_ratio", (("model", "base"),))] == 0.25
    assert samples[("rayft_serve_prefix_cache_hit_ratio", (("model", "base"),))] == 0.0  # a report without the cache
    metrics.set_load("base", {**report, "prefix_cache_hit_rate": 0.75, "prefix_cache_tokens": 640})
    samples = _samples(metrics)
    assert samples[("rayft_serve_prefix_cache_hit_ratio", (("model", "base"),))] == 0.75
    assert samples[("rayft_serve_prefix_cache_tokens", (("model", "base"),))] == 640
    if not Path(PROMTOOL).exists():
        pytest.skip("needs promtool (Debian's prometheus): apt-get install -y prometheus")
    metrics.timer("base", "alpha").done(200)
    body, _ = metrics.exposition()
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_runtime_adapters_evict_the_least_recently_used() -> None:
    adapters = RuntimeAdapters(2)
    assert adapters.add("a", "/a") == [] and adapters.add("b", "/b") == []
    adapters.touch("a")
    assert adapters.add("c", "/c") == ["b"]
    assert "b" not in adapters and adapters.source("a") == "/a"
    adapters.remove("a")
    assert adapters.add("d", "/d") == [] and "c" in adapters


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[1]", "takes a JSON object"),
        (b'{"lora_name": "x"}', "lora_path must be a non-empty string; got null"),
        (b'{"lora_name": " ", "lora_path": "/p"}', "lora_name must be a non-empty string"),
        (b'{"lora_name": "x", "lora_path": "/p", "lora_int_id": 3}', "unknown field 'lora_int_id'"),
    ],
)
def test_load_bodies_are_refused_by_field(raw: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message) as caught:
        parse_load(raw)
    assert caught.value.status == 400


def test_load_and_unload_bodies() -> None:
    load = parse_load(b'{"lora_name": "x", "lora_path": "s3://b/p", "base_model_name": "m"}')
    assert (load.lora_name, load.lora_path, load.base_model_name) == ("x", "s3://b/p", "m")
    assert parse_unload(b'{"lora_name": "x"}') == "x"


@pytest.fixture(scope="module")
def lora_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.checkpoints import build_lora_checkpoint

    return build_lora_checkpoint(tmp_path_factory.mktemp("lora") / "a", tiny_model_dir, seed=1)


def test_adapter_directories_are_checked_before_peft_loads_them(lora_dir: Path, tmp_path: Path) -> None:
    check_adapter_dir(lora_dir, "a")
    broken = tmp_path / "broken"
    shutil.copytree(lora_dir, broken)
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(RequestError, match="has an adapter_config.json but no weights"):
        check_adapter_dir(broken, "broken")
    config = json.loads((lora_dir / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(RequestError, match="holds a IA3 adapter, not LoRA"):
        check_adapter_dir(broken, "broken")
    with pytest.raises(RequestError, match="is a file, not a directory"):
        check_adapter_dir(lora_dir / "adapter_config.json", "file")


def test_an_adapter_of_another_width_does_not_fit(lora_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rayft.testing import build_tiny_model
    from tests.support.checkpoints import build_lora_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    check_fits(model, lora_dir, "a", "a")
    wide = build_lora_checkpoint(tmp_path / "wide", build_tiny_model(tmp_path / "wide-base", hidden_size=64))
    shape = r"lora_A.weight has shape \[4, \d+\], the base.s \S+ has in_features"
    with pytest.raises(RequestError, match=rf"does not fit the base model .*{shape}"):
        check_fits(model, wide, "wide", "wide")
    assert not hasattr(model, "peft_config")  # refused before PEFT touched the base


def test_a_uri_is_downloaded_once_through_the_storage_layer(
    lora_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path / "cache"))
    local = adapter_files(lora_dir.as_uri())
    assert local != lora_dir and (local / "adapter_model.safetensors").read_bytes() == (
        lora_dir / "adapter_model.safetensors").read_bytes()  # fmt: skip
    assert local_adapter_dir(lora_dir.as_uri(), tmp_path / "cache" / "served-adapters") == local
    with pytest.raises(RequestError, match="holds no files"):
        adapter_files((tmp_path / "empty").as_uri())
    with pytest.raises(RequestError, match="lora_path nosuch://x/y cannot be read"):
        adapter_files("nosuch://x/y")
