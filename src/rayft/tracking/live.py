"""Live training metrics for Prometheus, labelled with run, rank and stage.

On Ray the gauges go through Ray's own metrics system (``ray.util.metrics``): each node's metrics
agent exports them beside Ray's, wherever the cluster's Prometheus already scrapes Ray (Ray prefixes
them ``ray_``). In-process and under torchrun, a ``prometheus_client`` endpoint per rank serves them
(``logging.prometheus.port`` + rank). Names and labels are the same on both paths, less that prefix;
``deploy/monitoring/`` matches either.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

log = logging.getLogger("rayft.tracking")

LABELS = ("run", "rank", "stage")
# gauge name: (description, key in the metric stream)
STREAM_GAUGES: dict[str, tuple[str, str]] = {
    "rayft_train_step": ("Optimizer steps done.", "step"),
    "rayft_train_loss": ("Training loss of the last logged step.", "train/loss"),
    "rayft_train_learning_rate": ("Learning rate of the last logged step.", "train/learning_rate"),
    "rayft_train_tokens_per_second": ("Real (non-padding) tokens per second over the logging window.",
                                      "train/tokens_per_s"),
    "rayft_train_grad_norm": ("Global gradient norm before clipping.", "train/grad_norm"),
    "rayft_eval_loss": ("Validation loss of the last evaluation.", "eval/loss"),
    "rayft_train_rewards_accuracies": ("Preference training: share of pairs whose chosen response out-rewards the "
                                       "rejected one over the logging window.", "rewards/accuracies"),
    "rayft_train_rewards_margins": ("Preference training: mean reward margin (chosen minus rejected) over the "
                                    "logging window.", "rewards/margins"),
    "rayft_checkpoint_save_seconds": ("Seconds the training loop spent in the last checkpoint save.",
                                      "checkpoint/save_seconds"),
    "rayft_step_seconds": ("Wall seconds per optimizer step of this rank over the logging window.", "time/step"),
    "rayft_step_data_wait_seconds": ("Seconds per step this rank waited for its batches.", "time/data_wait"),
    "rayft_step_comm_seconds": ("Seconds per step this rank spent in the loop's collectives.", "time/comm"),
    "rayft_straggler_rank": ("The rank named a straggler in the last logging window (-1: none).",
                             "time/straggler_rank"),
}  # fmt: skip
OTHER_GAUGES: dict[str, str] = {
    "rayft_worker_restarts": "Worker-group starts of this run after the first (restarts after failures, --resume).",
    "rayft_data_rejected_rows": "Rows that could not become training examples (data/rejected.jsonl).",
    "rayft_gpu_memory_allocated_bytes": "GPU memory held by tensors on this rank's device.",
    "rayft_gpu_utilization_percent": "Utilisation of this rank's GPU over the last sample period (NVML).",
}


class GaugeBackend(Protocol):
    """Sets a labelled gauge."""

    def set(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Set gauge ``name`` to ``value`` for ``labels``."""
        ...

    def close(self) -> None:
        """Stop serving."""
        ...


def _descriptions() -> dict[str, str]:
    return {**{name: desc for name, (desc, _) in STREAM_GAUGES.items()}, **OTHER_GAUGES}


class RayGauges:
    """Gauges of ``ray.util.metrics`` (exported by the node's metrics agent)."""

    def __init__(self) -> None:
        from ray.util.metrics import Gauge

        self._gauges = {name: Gauge(name, description=desc, tag_keys=LABELS) for name, desc in _descriptions().items()}

    def set(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Record the value (exported at Ray's next report)."""
        self._gauges[name].set(value, tags=labels)

    def close(self) -> None:
        """Ray's agent keeps exporting the last values until the process exits."""


class ClientGauges:
    """Gauges of ``prometheus_client`` in a registry of their own, served on ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self._registry = CollectorRegistry()
        self._gauges = {
            name: Gauge(name, desc, LABELS, registry=self._registry) for name, desc in _descriptions().items()
        }
        self._server, _ = start_http_server(port, addr=host, registry=self._registry)
        self.port = int(self._server.server_address[1])
        log.info("Prometheus metrics at http://%s:%d/metrics", host, self.port)

    def set(self, name: str, value: float, labels: dict[str, str]) -> None:
        """Set the value (served at the next scrape)."""
        self._gauges[name].labels(**labels).set(value)

    def close(self) -> None:
        """Stop the endpoint."""
        self._server.shutdown()
        self._server.server_close()


class LiveMetrics:
    """A :class:`~rayft.training.loop.metrics.MetricLogger` that sets the live gauges from the metric
    stream of one rank (plus GPU memory and utilisation on a GPU)."""

    def __init__(self, backend: GaugeBackend, *, run: str, rank: int, stage: str = "train", device: Any = None) -> None:
        self._backend = backend
        self._labels = {"run": run, "rank": str(rank), "stage": stage}
        self._device = device

    def set(self, name: str, value: float) -> None:
        """Set one gauge for this rank."""
        self._backend.set(name, float(value), self._labels)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Update the gauges whose stream keys are in ``metrics``."""
        values = {"step": float(step), **metrics}
        for name, (_, key) in STREAM_GAUGES.items():
            value = values.get(key)
            if value is not None:
                self.set(name, value)
        self._gpu()

    def _gpu(self) -> None:
        if self._device is None or getattr(self._device, "type", "") != "cuda":
            return
        import torch

        self.set("rayft_gpu_memory_allocated_bytes", torch.cuda.memory_allocated(self._device))
        try:
            self.set("rayft_gpu_utilization_percent", torch.cuda.utilization(self._device))
        except Exception:  # no NVML (pynvml) here: memory only
            log.debug("no GPU utilisation (NVML unavailable)", exc_info=True)

    def close(self) -> None:
        """Stop the backend."""
        self._backend.close()


def open_live_metrics(*, host: str, port: int, on_ray: bool, run: str, rank: int, device: Any = None) -> LiveMetrics:
    """Live metrics for one rank: Ray's metrics system on Ray, a prometheus_client endpoint
    (``port`` + rank, any free port with 0) otherwise."""
    backend: GaugeBackend = RayGauges() if on_ray else ClientGauges(host, port + rank if port else 0)
    return LiveMetrics(backend, run=run, rank=rank, device=device)


def count_start(run_dir: Any) -> int:
    """Record one more worker-group start of the run in ``run_dir``; return the restarts so far."""
    path = os.path.join(str(run_dir), ".rayft-worker-starts")
    starts = int(open(path, encoding="utf-8").read() or 0) if os.path.exists(path) else 0  # noqa: SIM115
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(str(starts + 1))
    return starts
