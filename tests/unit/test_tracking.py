"""The trackers' pure parts: params and tags, the background sender's queue, retries and report,
and the start-up checks (missing extra, unreachable server, W&B key)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from rayft.config import load_config
from rayft.config.tracking import MlflowConfig
from rayft.errors import ConfigError
from rayft.tracking.errors import TrackerUnavailableError, check_wandb_key, probe_http, require_extra
from rayft.tracking.params import config_params, flatten, run_tags, summary_metrics
from rayft.tracking.sender import BackgroundSender, Record, backoff_delays


class ListSink:
    """A tracker that holds each metric up to the step in ``held`` and fails its first ``failures`` sends."""

    name = "list"

    def __init__(self, held: dict[str, int] | None = None, failures: int = 0, delay_s: float = 0.0) -> None:
        self.held, self.failures, self.delay_s = held or {}, failures, delay_s
        self.received: list[int] = []
        self.records: list[Record] = []
        self.batches: list[int] = []  # the size of each request that got through
        self.closed = False

    def connect(self) -> dict[str, int]:
        return self.held

    def send(self, records: Sequence[Record]) -> None:
        time.sleep(self.delay_s)
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("connection refused")
        self.batches.append(len(records))
        self.received += [step for step, _, _ in records]
        self.records += records

    def close(self) -> None:
        self.closed = True


def test_flatten_and_params_mask_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == {"a.b": 1, "a.c": [1, 2], "d": {}}
    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    params = config_params("train: {max_steps: 3}\nmodel: {name: hf_secretvalue123}\nlora: {target: [q, v]}\n")
    assert params == {"train.max_steps": "3", "model.name": "***REDACTED***", "lora.target": '["q", "v"]'}


def test_tags_and_stage_summaries() -> None:
    tags = run_tags("1.2.3", {"data_key": "abc", "world_size": 2, "none": None})
    assert tags == {"rayft.version": "1.2.3", "rayft.data_key": "abc", "rayft.world_size": "2"}
    summary = {"accepted": 10, "rate": 0.5, "ok": True, "model": "x", "ci": {"low": 0.1}, "pairs": [{"p": 0.01}]}
    metrics, params = summary_metrics(summary)
    assert metrics == {"accepted": 10.0, "rate": 0.5, "ok": 1.0, "ci.low": 0.1, "pairs.0.p": 0.01}
    assert params == {"model": "x"}


def test_sender_skips_held_steps_of_each_metric_and_sends_the_rest_in_order() -> None:
    sink = ListSink(held={"loss": 3, "save_s": 2})
    sender = BackgroundSender(sink, batch=2)
    for step in range(1, 8):
        sender.log(step, {"loss": 1.0})
    sender.log(3, {"save_s": 0.5})  # held up to step 2 only: step 3 is new
    report = sender.close()
    assert sink.received == [4, 5, 6, 7, 3] and sink.closed
    assert sink.records[-1][2] == {"save_s": 0.5}
    assert (report.sent, report.skipped, report.unsent_steps) == (5, 3, [])


def test_sender_gathers_steps_into_one_request_per_interval_and_close_does_not_wait() -> None:
    sink = ListSink(held={})
    sender = BackgroundSender(sink, min_interval_s=30.0)
    sender.log(1, {"loss": 1.0})
    deadline = time.monotonic() + 5
    while not sink.batches and time.monotonic() < deadline:  # the first record goes at once
        time.sleep(0.01)
    for step in range(2, 50):
        sender.log(step, {"loss": 1.0})
    started = time.monotonic()
    report = sender.close()
    assert time.monotonic() - started < 5  # close cuts the interval short
    assert sink.batches == [1, 48]
    assert report.sent == 49 and report.unsent_steps == []


def test_sender_retries_with_backoff_until_the_tracker_answers() -> None:
    sink = ListSink(failures=3)
    sender = BackgroundSender(sink, retry_first_s=0.01, retry_max_s=0.02)
    for step in range(1, 4):
        sender.log(step, {"loss": 1.0})
    report = sender.close(timeout_s=10)
    assert sink.received == [1, 2, 3] and report.unsent_steps == []
    assert [backoff_delays(0.5, 10.0)(n) for n in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_a_dead_tracker_never_blocks_the_caller_and_is_reported() -> None:
    sink = ListSink(failures=10**9)
    sender = BackgroundSender(sink, capacity=5, retry_first_s=0.01, retry_max_s=0.05)
    started = time.perf_counter()
    for step in range(1, 21):
        sender.log(step, {"loss": 1.0})
    assert time.perf_counter() - started < 0.5  # queue puts, never a send, on the caller's thread
    report = sender.close(timeout_s=1.0, outage_timeout_s=0.2)
    assert report.unsent_steps == list(range(1, 21)) and report.sent == 0
    assert "20 metric records (steps 1-20) could not be sent (ConnectionError: connection refused)" in report.describe()
    assert not [t for t in threading.enumerate() if t.name == "rayft-list-sender" and t.is_alive()]


def test_logging_config_takes_trackers() -> None:
    cfg = load_config(None, ["logging.prometheus=true", "logging.mlflow={tracking_uri: 'http://m:5000'}"])
    assert cfg.logging.prometheus.enabled and cfg.logging.mlflow == MlflowConfig(tracking_uri="http://m:5000")
    assert cfg.logging.mlflow.artifacts == ["config", "eval", "report", "profile"] and cfg.logging.wandb is None
    with pytest.raises(ConfigError, match="logging.wandb.mode = .cloud.: Input should be .online. or .offline."):
        load_config(None, ["logging.wandb={project: p, mode: cloud}"])


def test_a_missing_extra_names_the_pip_line() -> None:
    with pytest.raises(TrackerUnavailableError, match=r"pip install 'rayft\[mlflow\]'"):
        require_extra("rayft_no_such_module", "mlflow")


def test_an_unreachable_server_is_named() -> None:
    import socket

    with socket.socket() as sock:  # a port that refuses: bound, never listening
        sock.bind(("127.0.0.1", 0))
        uri = f"http://user:pw1234567@127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(TrackerUnavailableError, match=r"at http://user:\*\*\*REDACTED\*\*\*@127\.0\.0\.1:\d+ is"):
            probe_http(uri, timeout_s=2)
    probe_http("sqlite:///tmp/mlflow.db")  # not a server: nothing to probe


def test_wandb_online_without_a_key_says_how_to_go_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(TrackerUnavailableError, match="logging.wandb.mode=offline"):
        check_wandb_key("online")
    check_wandb_key("offline")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_wandb_key("online")


def test_a_local_ray_keeps_metrics_on_only_for_prometheus() -> None:
    from rayft._ray_private import local_system_config

    assert local_system_config({})["enable_metrics_collection"] is False
    assert "enable_metrics_collection" not in local_system_config({}, metrics=True)
