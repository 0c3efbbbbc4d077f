"""Kubernetes manifests of a rayft run, as plain dicts (pure: the config in, the objects out).

Every workload runs ``rayft <command> /etc/rayft/config.yaml``, the resolved config mounted
read-only from a ConfigMap; the runs go to the shared claim mounted at ``storage_path`` or to a
URI ``storage_path``; credentials come from a Secret by reference. The targets:

- ``rayjob``: a KubeRay RayJob (``ray.io/v1``) with its own Ray cluster, deleted when the job ends.
- ``raycluster``: a KubeRay RayCluster for interactive use (``rayft submit``), autoscaled.
- ``rayservice``: a KubeRay RayService serving ``serve.sources`` (``rayft serve --config <config>``).
- ``trainjob``: a Kubeflow Trainer TrainJob (``trainer.kubeflow.org/v1alpha1``) running torchrun.
- ``pytorchjob``: a Kubeflow training-operator PyTorchJob (``kubeflow.org/v1``) running torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayft.config import RayftConfig, dump_config
from rayft.deploy import pods
from rayft.deploy.pods import CONFIG_FILE, CONFIG_PATH, PodPlan
from rayft.errors import ConfigError
from rayft.serving.deployed import IMPORT_PATH

Manifest = dict[str, Any]
LABEL = "app.kubernetes.io/name"
# torchrun reads its node count, rank and rendezvous from the PET_* variables that both Kubeflow
# operators set; --no-python runs the `rayft` console script itself on every process.
TORCHRUN = ["torchrun", "--no-python"]


def render(cfg: RayftConfig, target: str, *, with_namespace: bool = False) -> list[Manifest]:
    """Every manifest of ``target`` for ``cfg``, in the order kubectl should apply them."""
    if target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    workload = TARGETS[target](cfg)
    plan = pods.plan_pods(cfg, extra_pods=1 if target in RAY_TARGETS else 0, torchrun=target not in RAY_TARGETS)
    out = namespace_manifests(cfg, plan) if with_namespace else []
    out.append(config_map(cfg))
    if cfg.k8s.storage.create and pods.storage_claim(cfg):
        out.append(claim(cfg))
    return [*out, workload]


def metadata(cfg: RayftConfig, name: str | None = None) -> dict[str, Any]:
    """Name, namespace and the labels every object of the run carries."""
    run = pods.k8s_name(cfg.name)
    labels = {LABEL: "rayft", "app.kubernetes.io/instance": run}
    return {"name": name or run, "namespace": cfg.k8s.namespace, "labels": labels}


def config_map(cfg: RayftConfig) -> Manifest:
    """The resolved config, as `rayft config show` prints it, under the key config.yaml."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(cfg, config_map_name(cfg)),
        "data": {CONFIG_FILE: dump_config(cfg)},
    }


def config_map_name(cfg: RayftConfig) -> str:
    """The name of the run's ConfigMap."""
    return f"{pods.k8s_name(cfg.name)}-config"


def claim(cfg: RayftConfig) -> Manifest:
    """A ReadWriteMany PersistentVolumeClaim for the runs (``k8s.storage.create``)."""
    storage = cfg.k8s.storage
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": storage.size}}}
    if storage.storage_class:
        spec["storageClassName"] = storage.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(cfg, storage.claim_name),
        "spec": spec,
    }


def namespace_manifests(cfg: RayftConfig, plan: PodPlan) -> list[Manifest]:
    """The Namespace, its ResourceQuota (what the job asks for, or ``k8s.quota``) and the ServiceAccount."""
    namespace = cfg.k8s.namespace
    out: list[Manifest] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {LABEL: "rayft"}}},
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": metadata(cfg, f"{namespace}-quota"),
            "spec": {"hard": {**default_quota(cfg, plan), **cfg.k8s.quota}},
        },
    ]
    if cfg.k8s.service_account:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(cfg, cfg.k8s.service_account)})
    return out


def default_quota(cfg: RayftConfig, plan: PodPlan) -> dict[str, str]:
    """Requests and limits of every pod of the job together: the worker pods and a Ray head."""
    cpu = float(pods.cpu_cores(plan.cpu)) * plan.worker_pods + float(pods.cpu_cores(cfg.k8s.head_cpu))
    memory = pods.memory_bytes(plan.memory) * plan.worker_pods + pods.memory_bytes(cfg.k8s.head_memory)
    quota = {"requests.cpu": pods.quantity(cpu), "requests.memory": pods.memory_quantity(memory)}
    quota |= {"limits.cpu": quota["requests.cpu"], "limits.memory": quota["requests.memory"]}
    if plan.gpus:
        quota[f"requests.{pods.GPU_RESOURCE}"] = str(plan.gpus * plan.worker_pods)
    return quota


def container(cfg: RayftConfig, name: str, limits: dict[str, str], **extra: Any) -> dict[str, Any]:
    """A container of the run's image with its environment, mounts and resources."""
    spec: dict[str, Any] = {
        "name": name,
        "image": cfg.k8s.image,
        "imagePullPolicy": cfg.k8s.image_pull_policy,
        **extra,
        "resources": {"requests": dict(limits), "limits": dict(limits)},
        "volumeMounts": pods.volume_mounts(cfg),
    }
    env = pods.container_env(cfg)
    if env:
        spec["env"] = env
    return spec


def pod_template(cfg: RayftConfig, containers: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod template with the run's labels, volumes and service account."""
    spec: dict[str, Any] = {"containers": containers, "volumes": pods.volumes(cfg, config_map_name(cfg))}
    if cfg.k8s.service_account:
        spec["serviceAccountName"] = cfg.k8s.service_account
    return {"metadata": {"labels": metadata(cfg)["labels"]}, "spec": spec}


def entrypoint(cfg: RayftConfig, command: str | None = None) -> list[str]:
    """``rayft <command> /etc/rayft/config.yaml``."""
    return ["rayft", command or cfg.k8s.command or "run", CONFIG_PATH]


def ray_cluster_spec(cfg: RayftConfig, plan: PodPlan, *, min_pods: int, max_pods: int) -> dict[str, Any]:
    """A head (running the driver) and one worker group sized from ``scaling``."""
    head_limits = {"cpu": cfg.k8s.head_cpu, "memory": cfg.k8s.head_memory}
    return {
        "rayVersion": pods.ray_version(cfg),
        "headGroupSpec": {
            "rayStartParams": {},
            "template": pod_template(cfg, [container(cfg, "ray-head", head_limits)]),
        },
        "workerGroupSpecs": [
            {
                "groupName": "workers",
                "replicas": min(max(plan.worker_pods, min_pods), max_pods),
                "minReplicas": min_pods,
                "maxReplicas": max_pods,
                "rayStartParams": {},
                "template": pod_template(cfg, [container(cfg, "ray-worker", plan.limits())]),
            }
        ],
    }


def ray_job(cfg: RayftConfig) -> Manifest:
    """A KubeRay RayJob: its own Ray cluster runs ``rayft <k8s.command> <config>`` and is deleted after."""
    plan = pods.plan_pods(cfg, extra_pods=1)
    spec: dict[str, Any] = {
        "entrypoint": " ".join(entrypoint(cfg)),
        "shutdownAfterJobFinishes": cfg.k8s.shutdown_after_job_finishes,
        "ttlSecondsAfterFinished": cfg.k8s.ttl_seconds_after_finished,
        "backoffLimit": cfg.k8s.backoff_limit,
        "rayClusterSpec": ray_cluster_spec(cfg, plan, min_pods=plan.worker_pods, max_pods=plan.worker_pods),
    }
    if cfg.k8s.active_deadline_s is not None:
        spec["activeDeadlineSeconds"] = cfg.k8s.active_deadline_s
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata(cfg), "spec": spec}


def ray_cluster(cfg: RayftConfig) -> Manifest:
    """A KubeRay RayCluster to submit to (``rayft submit``), its workers autoscaled within the bounds."""
    plan = pods.plan_pods(cfg, extra_pods=1)
    bounds = cfg.k8s.autoscaling
    max_pods = bounds.max_workers or plan.worker_pods
    if bounds.min_workers > max_pods:
        raise ConfigError(
            f"k8s.autoscaling.min_workers={bounds.min_workers} is above the {max_pods} worker pods the run needs; "
            f"lower it or set k8s.autoscaling.max_workers"
        )
    spec = ray_cluster_spec(cfg, plan, min_pods=bounds.min_workers if bounds.enabled else plan.worker_pods,
                            max_pods=max_pods if bounds.enabled else plan.worker_pods)  # fmt: skip
    if bounds.enabled:
        spec["enableInTreeAutoscaling"] = True
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata(cfg), "spec": spec}


def serve_config(cfg: RayftConfig) -> dict[str, Any]:
    """The Serve config of the RayService: the application ``rayft serve --config <config>`` runs."""
    application = {"name": "rayft", "route_prefix": "/", "import_path": IMPORT_PATH, "args": {"config": CONFIG_PATH}}
    return {"applications": [application]}


def ray_service(cfg: RayftConfig) -> Manifest:
    """A KubeRay RayService: ``serve.sources`` behind the OpenAI API on port 8000 of its serve Service,
    one worker pod per replica (autoscaled within ``serve.min_replicas``..``max_replicas`` when set)."""
    import yaml

    plan = pods.plan_pods(cfg, extra_pods=1)
    if not cfg.serve.sources:
        raise ConfigError(
            "serve.sources is empty; the RayService serves the models its config names: set serve.sources to run "
            "directories or checkpoints as the pods see them (under storage_path), or model names"
        )
    most = cfg.serve.max_replicas or cfg.serve.num_replicas
    least = cfg.serve.min_replicas if cfg.serve.min_replicas is not None else most
    cluster = ray_cluster_spec(cfg, plan, min_pods=least, max_pods=most)
    _add_api_keys(cfg, cluster)
    if cfg.serve.min_replicas is not None:
        cluster["enableInTreeAutoscaling"] = True
    spec = {"serveConfigV2": yaml.safe_dump(serve_config(cfg), sort_keys=False), "rayClusterConfig": cluster}
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": metadata(cfg), "spec": spec}


def _add_api_keys(cfg: RayftConfig, cluster: dict[str, Any]) -> None:
    """Every pod reads ``serve.api_keys_env`` from the Secret ``serve.api_keys_secret`` (by reference: the
    keys are in no manifest); the pod that builds the Serve application hashes them for the router."""
    secret, variable = cfg.serve.api_keys_secret, cfg.serve.api_keys_env
    if not secret or not variable:
        return
    entry = {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": variable}}}
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for container in (c for group in groups for c in group["template"]["spec"]["containers"]):
        container["env"] = [*(e for e in container.get("env", []) if e["name"] != variable), entry]


def kubeflow_command(cfg: RayftConfig) -> list[str]:
    """torchrun starting ``rayft train <config>`` once per worker of the node."""
    if cfg.k8s.command not in (None, "train"):
        raise ConfigError(
            f"k8s.command={cfg.k8s.command!r}: the Kubeflow targets run `rayft train` under torchrun only; set "
            "k8s.command=train (or leave it unset), or use --target rayjob for the other commands"
        )
    return [*TORCHRUN, *entrypoint(cfg, "train")]


def train_job(cfg: RayftConfig) -> Manifest:
    """A Kubeflow Trainer TrainJob on the torch runtime: numNodes pods of nprocPerNode workers."""
    plan = pods.plan_pods(cfg, torchrun=True)
    trainer: dict[str, Any] = {
        "image": cfg.k8s.image,
        "command": kubeflow_command(cfg),
        "numNodes": plan.worker_pods,
        "numProcPerNode": plan.workers_per_pod,
        "resourcesPerNode": {"requests": plan.limits(), "limits": plan.limits()},
    }
    env = pods.container_env(cfg)
    if env:
        trainer["env"] = env
    pod_spec: dict[str, Any] = {
        "volumes": pods.volumes(cfg, config_map_name(cfg)),
        "containers": [{"name": "node", "volumeMounts": pods.volume_mounts(cfg)}],
    }
    if cfg.k8s.service_account:
        pod_spec["serviceAccountName"] = cfg.k8s.service_account
    job_patch = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
    spec: dict[str, Any] = {
        "runtimeRef": {
            "name": cfg.k8s.kubeflow_runtime,
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
        },
        "trainer": trainer,
        "runtimePatches": [
            {"manager": "rayft", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job_patch]}}}}
        ],
    }
    if cfg.k8s.active_deadline_s is not None:
        spec["activeDeadlineSeconds"] = cfg.k8s.active_deadline_s
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata(cfg), "spec": spec}


def pytorch_job(cfg: RayftConfig) -> Manifest:
    """A Kubeflow PyTorchJob: a Master and numNodes-1 Workers, each running nprocPerNode workers."""
    plan = pods.plan_pods(cfg, torchrun=True)
    node = container(cfg, "pytorch", plan.limits(), command=kubeflow_command(cfg))
    replicas: dict[str, Any] = {"Master": _replica(cfg, node, 1)}
    if plan.worker_pods > 1:
        replicas["Worker"] = _replica(cfg, node, plan.worker_pods - 1)
    run_policy: dict[str, Any] = {"backoffLimit": cfg.k8s.backoff_limit}
    if cfg.k8s.active_deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = cfg.k8s.active_deadline_s
    spec = {"nprocPerNode": str(plan.workers_per_pod), "pytorchReplicaSpecs": replicas, "runPolicy": run_policy}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata(cfg), "spec": spec}


def _replica(cfg: RayftConfig, node: dict[str, Any], count: int) -> dict[str, Any]:
    return {"replicas": count, "restartPolicy": "Never", "template": pod_template(cfg, [node])}


TARGETS: dict[str, Callable[[RayftConfig], Manifest]] = {
    "rayjob": ray_job,
    "raycluster": ray_cluster,
    "rayservice": ray_service,
    "trainjob": train_job,
    "pytorchjob": pytorch_job,
}
RAY_TARGETS = frozenset({"rayjob", "raycluster", "rayservice"})
