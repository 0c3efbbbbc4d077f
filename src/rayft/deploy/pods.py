"""The pods a rayft run needs on Kubernetes, decided from the config alone (pure, no cluster).

:func:`plan_pods` sizes the worker pods from ``scaling`` and ``k8s.workers_per_pod``; the other
functions build the pieces every workload shares: the container's environment, its volumes and
their mounts. Bad combinations (a fractional GPU per pod, a local storage_path that the pods cannot
share) are refused here with the fix.
"""

from __future__ import annotations

import importlib.metadata
import math
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from rayft.config import RayftConfig
from rayft.config.checks import is_remote
from rayft.errors import ConfigError
from rayft.security import mask_uri

CONFIG_DIR = "/etc/rayft"
CONFIG_FILE = "config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
GPU_RESOURCE = "nvidia.com/gpu"
_CONFIG_VOLUME = "rayft-config"
_STORAGE_VOLUME = "rayft-storage"
# Ray's object store and NCCL live in /dev/shm, which a container gets at 64 MB unless a memory-backed
# volume is mounted there (Ray would fall back to slower disk, NCCL could fail).
_SHM_VOLUME = "dshm"


@dataclass(frozen=True)
class PodPlan:
    """How a run's workers map onto pods.

    Attributes:
        name: The DNS-1123 name of every object of the run (from the run's ``name``).
        worker_pods: Pods that hold the workers (Ray worker pods, or Kubeflow nodes).
        workers_per_pod: rayft workers per pod (torchrun's nprocPerNode on Kubeflow).
        cpu: CPUs of one worker pod, as a Kubernetes quantity.
        memory: Memory of one worker pod, as a Kubernetes quantity.
        gpus: Whole GPUs of one worker pod.
    """

    name: str
    worker_pods: int
    workers_per_pod: int
    cpu: str
    memory: str
    gpus: int

    def limits(self) -> dict[str, str]:
        """The resources of one worker pod (requests equal limits: the pod is what the worker asked for)."""
        limits = {"cpu": self.cpu, "memory": self.memory}
        if self.gpus:
            limits[GPU_RESOURCE] = str(self.gpus)
        return limits


def plan_pods(cfg: RayftConfig, *, extra_pods: int = 0, torchrun: bool = False) -> PodPlan:
    """Size the worker pods of ``cfg`` and check that its storage can be shared by them.

    Args:
        cfg: The resolved config.
        extra_pods: Pods besides the workers' (1 for a Ray head), for the storage check.
        torchrun: The workers run under torchrun (Kubeflow), which needs a shared filesystem.

    Raises:
        ConfigError: workers that do not divide into pods, a fractional GPU count per pod, or a
            local storage_path with several pods and no claim.
    """
    per_pod = cfg.k8s.workers_per_pod
    workers = max(cfg.scaling.num_workers, 1)
    if workers % per_pod:
        raise ConfigError(
            f"k8s.workers_per_pod={per_pod} does not divide scaling.num_workers={workers}; set k8s.workers_per_pod "
            f"to a divisor of {workers} (1 puts each worker in its own pod)"
        )
    pods = workers // per_pod
    check_shared_storage(cfg, pods + extra_pods, torchrun=torchrun)
    resources = cfg.scaling.resources_per_worker
    memory = resources.get("memory")
    return PodPlan(
        name=k8s_name(cfg.name),
        worker_pods=pods,
        workers_per_pod=per_pod,
        cpu=quantity(resources.get("CPU", 1.0) * per_pod),
        memory=quantity(memory * per_pod) if memory else _scaled(cfg.k8s.memory_per_worker, per_pod),
        gpus=gpus_per_pod(cfg),
    )


def gpus_per_pod(cfg: RayftConfig) -> int:
    """Whole GPUs of one worker pod: the worker's GPUs (1 with use_gpu: true) times workers_per_pod.

    ``use_gpu: auto`` cannot look at a cluster that is not there yet: it counts the GPUs that
    ``resources_per_worker`` names, none otherwise.
    """
    resources = cfg.scaling.resources_per_worker
    per_worker = resources.get("GPU", 1.0 if cfg.scaling.use_gpu is True else 0.0)
    if cfg.scaling.use_gpu is False:
        per_worker = 0.0
    total = per_worker * cfg.k8s.workers_per_pod
    if not math.isclose(total, round(total)):
        raise ConfigError(
            f"scaling.resources_per_worker.GPU={per_worker:g} x k8s.workers_per_pod={cfg.k8s.workers_per_pod} is "
            f"{total:g} GPUs per pod, but Kubernetes gives a pod whole GPUs ({GPU_RESOURCE}); set "
            "scaling.resources_per_worker.GPU to a whole number, or k8s.workers_per_pod so that the product is one"
        )
    return round(total)


def check_shared_storage(cfg: RayftConfig, pods: int, *, torchrun: bool = False) -> None:
    """Refuse a local ``storage_path`` that the pods could not share, a relative one, and a URI under
    torchrun (whose ranks write the run directory themselves, without rayft's upload mirror)."""
    if cfg.storage_path.startswith("file://"):
        raise ConfigError(
            f"storage_path={cfg.storage_path!r} is a file:// URI, which each pod resolves on its own disk; use the "
            "plain path on a shared claim (storage_path=/mnt/rayft/runs k8s.storage.claim_name=CLAIM) or an "
            "object store URI (storage_path=s3://bucket/runs)"
        )
    if mounted_storage(cfg) is None:
        if torchrun:
            raise ConfigError(
                f"storage_path={mask_uri(cfg.storage_path)!r}: the Kubeflow targets run rayft under torchrun, "
                "whose ranks write the run directory themselves; use a local path on a shared claim "
                "(storage_path=/mnt/rayft/runs k8s.storage.claim_name=CLAIM), or --target rayjob for a URI"
            )
        return
    if pods > 1 and cfg.k8s.storage.claim_name is None:
        raise ConfigError(
            f"storage_path={cfg.storage_path!r} is a local path, but the job runs {pods} pods and each would write "
            "its own copy; set k8s.storage.claim_name to a ReadWriteMany PersistentVolumeClaim (add "
            "k8s.storage.create=true to render one), or use a URI storage_path (storage_path=s3://bucket/runs)"
        )
    if not posixpath.isabs(cfg.storage_path):
        raise ConfigError(
            f"storage_path={cfg.storage_path!r} is relative, and a pod's working directory is not where a Ray job "
            f"runs; use an absolute path on the volume, e.g. storage_path=/mnt/rayft/{cfg.storage_path}"
        )


def mounted_storage(cfg: RayftConfig) -> str | None:
    """The ``storage_path`` the pods mount from a volume, or None for a URI, which each pod reaches itself."""
    # Rendered before any run exists, often on a machine without the credentials: no store to ask.
    return None if is_remote(cfg.storage_path) else cfg.storage_path


def storage_claim(cfg: RayftConfig) -> str | None:
    """The PersistentVolumeClaim that holds a local ``storage_path`` (None for a URI, or without one)."""
    return cfg.k8s.storage.claim_name if mounted_storage(cfg) is not None else None


def k8s_name(run_name: str) -> str:
    """The run's name as a DNS-1123 label of at most 40 characters (KubeRay appends suffixes to it)."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")[:40].strip("-")
    return name or "rayft"


def ray_version(cfg: RayftConfig) -> str:
    """The Ray version of the cluster: ``k8s.ray_version``, else the one installed here."""
    if cfg.k8s.ray_version:
        return cfg.k8s.ray_version
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("k8s.ray_version is unset and Ray is not installed here; set k8s.ray_version") from None


def container_env(cfg: RayftConfig) -> list[dict[str, Any]]:
    """Plain variables of ``k8s.env``, then each credential of ``k8s.secret_env`` as a secretKeyRef."""
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(cfg.k8s.env.items())]
    for name in cfg.k8s.secret_env:
        ref = {"name": cfg.k8s.secret_name, "key": name}
        env.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
    return env


def volumes(cfg: RayftConfig, config_map: str) -> list[dict[str, Any]]:
    """The config (a ConfigMap), a memory-backed /dev/shm and, for a local storage_path, the shared claim."""
    out: list[dict[str, Any]] = [
        {"name": _CONFIG_VOLUME, "configMap": {"name": config_map}},
        {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]
    claim = storage_claim(cfg)
    if claim:
        out.append({"name": _STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    return out


def volume_mounts(cfg: RayftConfig) -> list[dict[str, Any]]:
    """The config, read-only at /etc/rayft/config.yaml, /dev/shm, and the claim at storage_path."""
    out: list[dict[str, Any]] = [
        {"name": _CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": _SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    if storage_claim(cfg):
        out.append({"name": _STORAGE_VOLUME, "mountPath": cfg.storage_path})
    return out


def quantity(value: float) -> str:
    """A number of CPUs or bytes as a Kubernetes quantity (millicores when fractional)."""
    if math.isclose(value, round(value)):
        return str(round(value))
    return f"{round(value * 1000)}m"


def memory_quantity(size: int) -> str:
    """A number of bytes as a quantity: in Gi or Mi when it divides evenly, in bytes otherwise."""
    for unit in ("Ti", "Gi", "Mi"):
        if size and size % int(_UNITS[unit]) == 0:
            return f"{size // int(_UNITS[unit])}{unit}"
    return str(size)


def _scaled(text: str, factor: int) -> str:
    """``16Gi`` times ``factor``, keeping the unit."""
    number, unit = _split_quantity(text)
    number *= factor
    return f"{round(number) if number.is_integer() else number}{unit}"


_UNITS = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_UNITS |= {f"{p}i": 1024.0 ** (i + 1) for i, p in enumerate("KMGTPE")}


def _split_quantity(text: str) -> tuple[float, str]:
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if match is None or match.group(2) not in _UNITS:
        raise ConfigError(f"{text!r} is not a Kubernetes quantity (e.g. 2, 500m, 16Gi)")
    return float(match.group(1)), match.group(2)


def cpu_cores(text: str) -> float:
    """A CPU quantity (``2``, ``500m``) in cores."""
    number, unit = _split_quantity(text)
    return number * _UNITS[unit]


def memory_bytes(text: str) -> int:
    """A memory quantity (``16Gi``, ``64G``, a number of bytes) in bytes."""
    number, unit = _split_quantity(text)
    return round(number * _UNITS[unit])
