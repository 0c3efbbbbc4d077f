"""Config sections for the experiment trackers (MLflow, Weights & Biases) and live Prometheus metrics."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from rayft.config.base import Section

MlflowArtifact = Literal["config", "final", "export", "eval", "report", "profile"]

MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")
"""The tracking URI schemes MLflow serves (a database scheme may name its driver: ``postgresql+psycopg2``),
besides ``file:``, which MLflow 3 refuses unless :data:`FILE_STORE_VARIABLE` is true."""
FILE_STORE_VARIABLE = "MLFLOW_ALLOW_FILE_STORE"


class MlflowConfig(Section):
    """An MLflow tracking server that receives params, tags, the metric stream and artifacts.

    Credentials come from the environment only (``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD``, or ``MLFLOW_TRACKING_TOKEN``), never from the config.
    """

    tracking_uri: str = Field(
        description=(
            "The tracking server, e.g. http://mlflow.internal:5000, or a local store in a SQLite file, "
            "sqlite:////abs/path/mlflow.db (a file:/ store needs MLFLOW_ALLOW_FILE_STORE=true with MLflow 3)."
        )
    )
    experiment: str = Field("rayft", min_length=1, description="Experiment the runs are logged under.")
    run_name: str | None = Field(None, description="Name of the MLflow run (default: the rayft run's name).")
    artifacts: list[MlflowArtifact] = Field(
        default_factory=lambda: list[MlflowArtifact](["config", "eval", "report", "profile"]),
        description=(
            "What is uploaded at the end: 'config' (the resolved config), 'final' (final/: the adapter, or the "
            "whole model with train.method full, of the last training under rayft run: preference training's when it "
            "ran; can be large), 'export' (the merged export/ of rayft run), "
            "'eval' (compare/eval JSON), 'report' (report.html of rayft run), 'profile' (profile/: the step "
            "breakdown and the torch.profiler traces of train.profile). [] uploads nothing."
        ),
    )
    send_interval_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description=(
            "Seconds between two requests of the metric stream (each carries every step logged meanwhile); "
            "each request costs the server CPU (16 ms measured on a SQLite-backed server): lower for livelier "
            "charts, higher for a busy server."
        ),
    )

    @field_validator("tracking_uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        scheme = uri.partition(":")[0].partition("+")[0].lower() if ":" in uri else ""
        if scheme == "file" and os.environ.get(FILE_STORE_VARIABLE, "").strip().lower() != "true":
            raise ValueError(
                f"MLflow 3 refuses its file: store unless {FILE_STORE_VARIABLE}=true is exported; keep a local "
                "store in a SQLite file instead, e.g. sqlite:////abs/path/mlflow.db, give a server, e.g. "
                f"http://host:5000, or export {FILE_STORE_VARIABLE}=true"
            )
        if scheme not in (*MLFLOW_SCHEMES, "file"):
            raise ValueError(
                f"not an MLflow tracking URI (scheme {scheme or 'missing'!r}); give a server, e.g. "
                f"http://host:5000, or a SQLite file, e.g. sqlite:////abs/path/mlflow.db (schemes: "
                f"{', '.join(MLFLOW_SCHEMES)})"
            )
        return uri

    required: bool = Field(
        True,
        description=(
            "An unreachable tracking server at start is an error; false logs a warning and the run goes on "
            "without MLflow."
        ),
    )


class WandbConfig(Section):
    """A Weights & Biases project that receives the config, tags and the metric stream.

    The API key comes from the environment only (``WANDB_API_KEY``).
    """

    project: str = Field(min_length=1, description="W&B project.")
    entity: str | None = Field(None, description="W&B entity (team or user; default: the key's default entity).")
    mode: Literal["online", "offline"] = Field(
        "online",
        description="'online' sends as the run goes (needs WANDB_API_KEY); 'offline' writes under wandb/ in the "
        "run directory, to `wandb sync` later.",
    )
    required: bool = Field(
        True, description="A W&B that cannot start is an error; false logs a warning and the run goes on without it."
    )


class PrometheusConfig(Section):
    """Live training metrics for Prometheus (see deploy/monitoring/)."""

    enabled: bool = Field(
        False,
        description=(
            "Export step, loss, learning rate, tokens/s, grad norm, checkpoint save seconds, worker restarts, "
            "rejected rows (and GPU memory and utilisation on GPUs), labelled with run, rank and stage: through "
            "Ray's metrics system on Ray (a Ray that rayft starts then keeps metrics collection on), through a "
            "prometheus_client endpoint in-process and under torchrun."
        ),
    )
    port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="Port of the prometheus_client endpoint (in-process and torchrun; rank r uses port + r; 0: any).",
    )
    host: str = Field("0.0.0.0", description="Address the prometheus_client endpoint listens on.")
