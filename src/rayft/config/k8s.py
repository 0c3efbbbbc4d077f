"""Config section for running on Kubernetes: what `rayft k8s render` and the Helm chart put in the manifests.

The workload itself (workers, GPUs per worker, storage) comes from ``scaling`` and ``storage_path``;
this section holds only what Kubernetes adds: the image, the namespace, the shared volume, the
Secret that credentials come from, and the lifetime of the job.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rayft.config.base import Section
from rayft.security import is_secret_name

# A Kubernetes quantity: 16Gi, 500m, 2, 1.5, 64G...
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# A DNS-1123 label: what names of Secrets, claims, namespaces and service accounts must be.
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class K8sStorageConfig(Section):
    """The shared volume that holds the runs when ``storage_path`` is a local path."""

    claim_name: str | None = Field(
        None,
        pattern=_DNS_LABEL,
        max_length=63,
        description=(
            "A PersistentVolumeClaim (ReadWriteMany, so every pod mounts it) mounted at storage_path in every "
            "pod. Needed when storage_path is a local path and the job has more than one pod; a URI "
            "storage_path (s3://...) needs none."
        ),
    )
    create: bool = Field(
        False,
        description=(
            "Render the claim too (ReadWriteMany, of `size` and `storage_class`) instead of using an existing one."
        ),
    )
    size: str = Field("100Gi", pattern=_QUANTITY, description="Size of the claim that `create` renders.")
    storage_class: str | None = Field(
        None,
        description=(
            "StorageClass of the claim that `create` renders; unset uses the cluster's default (it must support "
            "ReadWriteMany)."
        ),
    )


class K8sAutoscalingConfig(Section):
    """Bounds of the worker group of a RayCluster (target `raycluster`) under the KubeRay autoscaler."""

    enabled: bool = Field(True, description="Run the KubeRay autoscaler in the RayCluster.")
    min_workers: int = Field(0, ge=0, description="Fewest worker pods the autoscaler keeps.")
    max_workers: int | None = Field(
        None, ge=1, description="Most worker pods the autoscaler starts (unset: the pods scaling.num_workers needs)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> K8sAutoscalingConfig:
        if self.max_workers is not None and self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) is above max_workers ({self.max_workers}); "
                "lower k8s.autoscaling.min_workers"
            )
        return self


class K8sConfig(Section):
    """Kubernetes settings of `rayft k8s render` (RayJob, RayCluster, TrainJob, PyTorchJob) and the Helm chart."""

    image: str = Field(
        "rayft:0.1.0",
        min_length=1,
        description="Container image with rayft installed (built from deploy/Dockerfile); --image overrides it.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    namespace: str = Field("rayft", pattern=_DNS_LABEL, max_length=63, description="Namespace of every manifest.")
    command: Literal["run", "train", "tune", "sdg", "eval"] | None = Field(
        None,
        description=(
            "The rayft command the workload runs on the config (`rayft <command> <config>`); unset: `run` (the "
            "pipeline) for a RayJob, `train` for the Kubeflow targets, which run `rayft train` under torchrun only."
        ),
    )
    service_account: str | None = Field(
        None,
        pattern=_DNS_LABEL,
        description="ServiceAccount of the pods (rendered with --with-namespace); unset uses the namespace's default.",
    )
    secret_name: str | None = Field(
        None,
        pattern=_DNS_LABEL,
        description=(
            "A Secret in the namespace holding credentials; each name of secret_env is read from its key of that name."
        ),
    )
    secret_env: list[str] = Field(
        default_factory=list,
        description=(
            "Environment variables set from secret_name's keys of the same name (e.g. HF_TOKEN, AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY): credentials reach the pods by reference, never by value."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Plain environment variables of every container; a credential here is refused (use secret_env).",
    )
    workers_per_pod: int = Field(
        1,
        ge=1,
        description=(
            "rayft workers (scaling.num_workers) per pod: a Ray worker pod, or a Kubeflow node with this many "
            "torchrun processes (nprocPerNode). The pod gets this many times scaling.resources_per_worker."
        ),
    )
    memory_per_worker: str = Field(
        "16Gi",
        pattern=_QUANTITY,
        description="Memory of one worker when scaling.resources_per_worker has no `memory` (bytes).",
    )
    head_cpu: str = Field("2", pattern=_QUANTITY, description="CPU of the Ray head pod, which runs the driver.")
    head_memory: str = Field("8Gi", pattern=_QUANTITY, description="Memory of the Ray head pod.")
    ray_version: str | None = Field(
        None, description="rayVersion of the Ray cluster; unset: the Ray version installed here (match the image's)."
    )
    shutdown_after_job_finishes: bool = Field(True, description="RayJob: delete the Ray cluster when the job ends.")
    ttl_seconds_after_finished: int = Field(
        3600, ge=0, description="RayJob: seconds the finished job's cluster is kept (for logs) before it is deleted."
    )
    backoff_limit: int = Field(
        0,
        ge=0,
        description=(
            "Retries of the whole job after a failure (RayJob and Kubeflow jobs); rayft already retries workers "
            "(failure.max_failures), so 0 is usual. A retry of `rayft train` is not a resume: see the cluster guide."
        ),
    )
    active_deadline_s: int | None = Field(
        None, gt=0, description="Seconds after which a running job is stopped and marked failed (unset: no limit)."
    )
    kubeflow_runtime: str = Field(
        "torch-distributed",
        min_length=1,
        description=(
            "TrainJob: the ClusterTrainingRuntime that runs torchrun (Kubeflow Trainer installs torch-distributed)."
        ),
    )
    storage: K8sStorageConfig = Field(
        default_factory=K8sStorageConfig, description="The shared volume for a local storage_path."
    )
    autoscaling: K8sAutoscalingConfig = Field(
        default_factory=K8sAutoscalingConfig, description="Worker bounds of a RayCluster."
    )
    quota: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "ResourceQuota of the namespace (--with-namespace), e.g. {requests.nvidia.com/gpu: '8'}; entries "
            "override the default, which is what the job asks for (CPU, memory and GPUs of every pod)."
        ),
    )

    @field_validator("secret_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not _ENV_NAME.match(n)]
        if bad:
            raise ValueError(f"{bad} are not environment variable names; use letters, digits and _")
        return names

    @field_validator("env")
    @classmethod
    def _no_inline_secret(cls, env: dict[str, str]) -> dict[str, str]:
        secrets = sorted(name for name in env if is_secret_name(name))
        if secrets:
            raise ValueError(
                f"{secrets} hold credentials and would be written into the manifests in plain text; put them in a "
                f"Secret (kubectl create secret generic NAME --from-literal={secrets[0]}=...) and set "
                f"k8s.secret_name=NAME k8s.secret_env=[{','.join(secrets)}] instead"
            )
        return env

    @model_validator(mode="after")
    def _secret_named(self) -> K8sConfig:
        if self.secret_env and self.secret_name is None:
            raise ValueError(
                f"secret_env lists {self.secret_env} but secret_name is unset; set k8s.secret_name to the Secret "
                "that holds them"
            )
        return self
