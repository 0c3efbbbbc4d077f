"""Prometheus metrics of ``rayft serve``, per model and adapter, at ``/metrics`` on the server's own port.

The router counts what it sees of every request (:class:`RequestTimer`): its status, its errors, its prompt
and generated tokens, the time to its first token, the time between its tokens and its whole latency. The
load of each base model's deployment (requests waiting and running per adapter, KV cache reserved) is asked
of one of its replicas at each scrape (:meth:`ServeMetrics.set_load`). Every series carries ``model`` (the
base model's id) and ``adapter`` (the adapter's id, empty for the base itself), so that one base and its
adapters are told apart; a request for a model that is not served counts under empty labels, so clients
cannot grow the label sets without bound. prometheus_client writes the text exposition; the metrics live in a
registry of their own, so nothing of the process (Ray's, another library's) leaks into the scrape.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

LABELS = ("model", "adapter")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
"""Seconds: time to first token and whole requests, from a cached short prompt to a long completion on CPU."""

TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
"""Seconds between two tokens of one completion: a decoding step, from a GPU's few ms to a loaded CPU's."""


class ServeMetrics:
    """The router's metrics in a registry of their own; see the module docstring."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "rayft_serve_requests",
            "Requests answered, by HTTP status (a stream that failed after its start counts under its error's status).",
            [*LABELS, "status"],
            registry=r,
        )
        self.errors = Counter(
            "rayft_serve_request_errors",
            "Requests that ended in an error, by OpenAI error code (or type).",
            [*LABELS, "code"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "rayft_serve_prompt_tokens", "Prompt tokens of the requests that ran.", LABELS, registry=r
        )
        self.generation_tokens = Counter("rayft_serve_generation_tokens", "Tokens generated.", LABELS, registry=r)
        self.first_token = Histogram(
            "rayft_serve_time_to_first_token_seconds",
            "From a request's arrival at the router to its first generated text.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.token_gap = Histogram(
            "rayft_serve_time_between_tokens_seconds",
            "Between two pieces of generated text of one completion (one per decoding step).",
            LABELS,
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "rayft_serve_request_latency_seconds",
            "From a request's arrival to the end of its response (of its stream, when streamed).",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.waiting = Gauge(
            "rayft_serve_queue_depth",
            "Requests waiting in a replica for a row of its running batch.",
            LABELS,
            registry=r,
        )
        self.running = Gauge(
            "rayft_serve_running_requests",
            "Requests in a replica's running batch (the rows it decodes together).",
            LABELS,
            registry=r,
        )
        self.kv_used = Gauge(
            "rayft_serve_kv_cache_usage_ratio",
            "Share of a replica's KV cache budget (serve.kv_cache_tokens) its running requests reserve.",
            ["model"],
            registry=r,
        )
        self.adapters = Gauge(
            "rayft_serve_adapters_loaded", "LoRA adapters whose weights a replica holds.", ["model"], registry=r
        )
        self.prefix_hit_rate = Gauge(
            "rayft_serve_prefix_cache_hit_ratio",
            "Share of the prompt tokens a replica looked up in its prompt-prefix cache (serve.prefix_cache_tokens) "
            "since it started that came from the cache, not from a prefill.",
            ["model"],
            registry=r,
        )
        self.prefix_tokens = Gauge(
            "rayft_serve_prefix_cache_tokens", "Prompt tokens a replica's prefix cache holds.", ["model"], registry=r
        )

    def timer(self, model: str, adapter: str | None) -> RequestTimer:
        """The timer of one request that has just arrived, for the base ``model`` and its ``adapter``."""
        return RequestTimer(self, model, adapter or "")

    def set_load(self, model: str, load: Mapping[str, Any]) -> None:
        """Set the load gauges of the deployment of base ``model`` from a replica's :meth:`Engine.load` report."""
        for gauge, key in ((self.waiting, "waiting"), (self.running, "running")):
            for child in _children_of(gauge, model):
                gauge.labels(*child).set(0)  # an adapter with no request left is not in the report
            for adapter, count in load[key].items():
                gauge.labels(model, adapter).set(count)
            gauge.labels(model, "").inc(0)  # the base's series exists from the first scrape
        capacity = max(int(load["kv_capacity"]), 1)
        self.kv_used.labels(model).set(load["kv_reserved"] / capacity)
        self.adapters.labels(model).set(load["adapters_loaded"])
        self.prefix_hit_rate.labels(model).set(load.get("prefix_cache_hit_rate", 0.0))
        self.prefix_tokens.labels(model).set(load.get("prefix_cache_tokens", 0))

    def exposition(self) -> tuple[bytes, str]:
        """The scrape's body (Prometheus' text format) and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _children_of(gauge: Any, model: str) -> list[tuple[str, ...]]:
    # prometheus_client keeps a labelled metric's children in `_metrics` and offers no public listing.
    return [labels for labels in list(gauge._metrics) if labels[0] == model]


class RequestTimer:
    """One request's figures, recorded as they happen; :meth:`done` records its end once."""

    def __init__(self, metrics: ServeMetrics, model: str, adapter: str) -> None:
        self.metrics, self.labels = metrics, (model, adapter)
        self.started = time.perf_counter()
        self.last: float | None = None
        self.ended = False

    def relabel(self, model: str, adapter: str | None) -> None:
        """The request's model, once its body is parsed and the model found among those served."""
        self.labels = (model, adapter or "")

    def piece(self) -> None:
        """A piece of generated text arrived (of the request's first choice: the others run alongside)."""
        now = time.perf_counter()
        if self.last is None:
            self.metrics.first_token.labels(*self.labels).observe(now - self.started)
        else:
            self.metrics.token_gap.labels(*self.labels).observe(now - self.last)
        self.last = now

    def event(self, *, end: bool) -> None:
        """An event of the first choice: a piece of text, or its end."""
        if end:
            self.finished()
        else:
            self.piece()

    def finished(self) -> None:
        """The request's first choice ended: its end counts as its first token when no text came before it
        (its first token was the end of sequence)."""
        if self.last is None:
            self.last = time.perf_counter()
            self.metrics.first_token.labels(*self.labels).observe(self.last - self.started)

    def tokens(self, prompt: int, generated: int) -> None:
        """Tokens the request took and produced."""
        self.metrics.prompt_tokens.labels(*self.labels).inc(prompt)
        self.metrics.generation_tokens.labels(*self.labels).inc(generated)

    def done(self, status: int, error: dict[str, Any] | None = None) -> None:
        """The request ended with HTTP ``status`` (and the OpenAI ``error`` body's inner object, if it failed)."""
        if self.ended:
            return
        self.ended = True
        self.metrics.requests.labels(*self.labels, str(status)).inc()
        self.metrics.latency.labels(*self.labels).observe(time.perf_counter() - self.started)
        if status >= 400:
            code = (error or {}).get("code") or (error or {}).get("type") or "unknown"
            self.metrics.errors.labels(*self.labels, str(code)).inc()
