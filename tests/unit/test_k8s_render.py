"""`rayft k8s render`: manifests rendered from a config, validated against the real CRD and Kubernetes schemas."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from rayft.cli.main import cli
from rayft.config import load_config
from rayft.deploy.manifests import TARGETS, render
from rayft.errors import ConfigError
from tests.support.k8s_schemas import validate, validate_all

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "configs" / "gsm8k-qwen2.5-1.5b.yaml"
QUICKSTART = REPO / "configs" / "quickstart.yaml"
CLUSTER = [
    "k8s.storage.claim_name=rayft-runs",
    "k8s.storage.create=true",
    "k8s.storage.storage_class=nfs",
    "k8s.secret_name=rayft-credentials",
    "k8s.secret_env=[HF_TOKEN,AWS_ACCESS_KEY_ID]",
    "k8s.env={HF_HUB_ENABLE_HF_TRANSFER: '0'}",
    "k8s.service_account=rayft",
    "k8s.active_deadline_s=86400",
    "k8s.ray_version=2.60.0",
    "serve.sources=[/runs/gsm8k-lora]",
]
KUBEFLOW = ("trainjob", "pytorchjob")


def cluster_config(*extra: str, path: Path = GSM8K):  # type: ignore[no-untyped-def]
    return load_config(path, [*CLUSTER, *extra])


def by_kind(manifests: list[dict], kind: str) -> dict:  # type: ignore[type-arg]
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_target_validates_strictly_against_its_schemas(target: str) -> None:
    manifests = render(cluster_config(), target, with_namespace=True)
    kinds = [m["kind"] for m in manifests]
    assert kinds[:5] == ["Namespace", "ResourceQuota", "ServiceAccount", "ConfigMap", "PersistentVolumeClaim"]
    validate_all(manifests)


@pytest.mark.parametrize("target", ["rayjob", "raycluster"])
def test_a_uri_storage_path_needs_no_claim(target: str) -> None:
    overrides = ["storage_path=s3://bucket/runs", "k8s.ray_version=2.60.0"]
    manifests = render(load_config(QUICKSTART, overrides), target)
    assert [m["kind"] for m in manifests] == ["ConfigMap", manifests[-1]["kind"]]
    workload = yaml.safe_dump(manifests[-1])
    assert "persistentVolumeClaim" not in workload
    validate_all(manifests)


def test_the_strict_check_rejects_an_unknown_field() -> None:
    job = render(cluster_config(), "rayjob")[-1]
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(jsonschema.ValidationError, match="'gpus' was unexpected"):
        validate(job)
    config_map = render(cluster_config(), "rayjob")[0]
    config_map["spec"] = {}
    with pytest.raises(Exception, match="'spec' was unexpected"):
        validate(config_map)


def test_rayjob_runs_the_config_on_a_cluster_sized_from_scaling() -> None:
    cfg = cluster_config("k8s.ttl_seconds_after_finished=600", "k8s.backoff_limit=2", "k8s.image=reg.io/rayft:1")
    job = render(cfg, "rayjob")[-1]
    spec = job["spec"]
    assert job["metadata"] == {
        "name": "gsm8k-granite-2b",
        "namespace": "rayft",
        "labels": {"app.kubernetes.io/name": "rayft", "app.kubernetes.io/instance": "gsm8k-granite-2b"},
    }
    assert spec["entrypoint"] == "rayft run /etc/rayft/config.yaml"
    assert (spec["shutdownAfterJobFinishes"], spec["ttlSecondsAfterFinished"]) == (True, 600)
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (2, 86400)
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (4, 4, 4)  # scaling.num_workers: 4
    (worker,) = group["template"]["spec"]["containers"]
    assert worker["image"] == "reg.io/rayft:1"
    assert worker["resources"]["limits"] == {"cpu": "1", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "rayft-credentials", "key": "HF_TOKEN"}}} in (
        worker["env"]
    )
    assert {"name": "rayft-storage", "mountPath": "/mnt/shared/rayft-runs"} in worker["volumeMounts"]
    assert {"name": "rayft-config", "mountPath": "/etc/rayft", "readOnly": True} in worker["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "rayft"
    assert {"name": "rayft-config", "configMap": {"name": "gsm8k-granite-2b-config"}} in head["volumes"]
    assert {"name": "rayft-storage", "persistentVolumeClaim": {"claimName": "rayft-runs"}} in head["volumes"]


def test_pods_get_cpu_memory_and_gpus_of_their_workers() -> None:
    cfg = cluster_config(
        "scaling.num_workers=8", "scaling.resources_per_worker={CPU: 6, GPU: 1, memory: 34359738368}",
        "k8s.workers_per_pod=4",
    )  # fmt: skip
    manifests = render(cfg, "rayjob", with_namespace=True)
    (group,) = manifests[-1]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 2
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "24", "memory": "137438953472", "nvidia.com/gpu": "4"}
    quota = by_kind(manifests, "ResourceQuota")["spec"]["hard"]
    assert quota["requests.nvidia.com/gpu"] == "8"
    assert quota["requests.cpu"] == "50"  # two pods of 24 and a head of 2
    assert quota["requests.memory"] == "264Gi"  # two pods of 128Gi and a head of 8Gi


def test_the_quota_takes_the_configured_entries() -> None:
    cfg = cluster_config("k8s.quota={requests.nvidia.com/gpu: '16', pods: '20'}")
    quota = by_kind(render(cfg, "rayjob", with_namespace=True), "ResourceQuota")["spec"]["hard"]
    assert (quota["requests.nvidia.com/gpu"], quota["pods"]) == ("16", "20")


def test_the_config_map_loads_back_to_the_same_resolved_config(tmp_path: Path) -> None:
    cfg = cluster_config("train.learning_rate=1e-4", "lora.r=8")
    config_map = render(cfg, "rayjob")[0]
    saved = tmp_path / "config.yaml"
    saved.write_text(config_map["data"]["config.yaml"])
    assert load_config(saved) == cfg


def test_raycluster_autoscales_within_the_bounds() -> None:
    cfg = cluster_config("k8s.autoscaling.min_workers=1", "k8s.autoscaling.max_workers=6")
    cluster = render(cfg, "raycluster")[-1]
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 4, 6)
    fixed = render(cluster_config("k8s.autoscaling.enabled=false"), "raycluster")[-1]
    assert "enableInTreeAutoscaling" not in fixed["spec"]
    (group,) = fixed["spec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (4, 4, 4)


def test_trainjob_runs_torchrun_with_nodes_and_processes_from_scaling() -> None:
    cfg = cluster_config("scaling.num_workers=8", "k8s.workers_per_pod=4")
    job = render(cfg, "trainjob")[-1]
    trainer = job["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "--no-python", "rayft", "train", "/etc/rayft/config.yaml"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    (patch,) = job["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["name"] == "node"
    assert {"name": "rayft-storage", "persistentVolumeClaim": {"claimName": "rayft-runs"}} in pod["volumes"]


def test_pytorchjob_has_a_master_and_workers() -> None:
    cfg = cluster_config("scaling.num_workers=6", "k8s.workers_per_pod=2")
    job = render(cfg, "pytorchjob")[-1]
    assert job["spec"]["nprocPerNode"] == "2"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    (container,) = replicas["Worker"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"  # the name the training-operator looks for
    assert container["command"][-3:] == ["rayft", "train", "/etc/rayft/config.yaml"]
    assert job["spec"]["runPolicy"] == {"backoffLimit": 0, "activeDeadlineSeconds": 86400}


def test_one_pod_with_a_local_path_needs_no_claim() -> None:
    cfg = load_config(QUICKSTART, ["storage_path=/data/runs", "scaling.num_workers=2",
                                   "k8s.workers_per_pod=2"])  # fmt: skip
    (config_map, job) = render(cfg, "pytorchjob")
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    validate_all([config_map, job])


# --- bad input ---------------------------------------------------------------------------------------


def test_a_fractional_gpu_per_pod_is_refused() -> None:
    cfg = cluster_config("scaling.resources_per_worker={GPU: 0.5}")
    with pytest.raises(ConfigError, match=r"GPU=0.5 x k8s.workers_per_pod=1 is 0.5 GPUs per pod.*whole"):
        render(cfg, "rayjob")
    render(cluster_config("scaling.resources_per_worker={GPU: 0.5}", "k8s.workers_per_pod=2"), "rayjob")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_local_storage_path_without_a_claim_is_refused(target: str) -> None:
    cfg = load_config(GSM8K, ["k8s.ray_version=2.60.0"])
    with pytest.raises(ConfigError, match=r"storage_path='/mnt/shared/rayft-runs' is a local path.*k8s.storage"):
        render(cfg, target)


def test_a_relative_or_file_storage_path_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"storage_path='runs' is relative.*storage_path=/mnt/rayft/runs"):
        render(cluster_config("storage_path=runs"), "rayjob")
    with pytest.raises(ConfigError, match=r"file:// URI, which each pod resolves on its own disk"):
        render(cluster_config("storage_path=file:///mnt/runs"), "rayjob")


@pytest.mark.parametrize("target", KUBEFLOW)
def test_a_uri_storage_path_is_refused_under_torchrun(target: str) -> None:
    cfg = cluster_config("storage_path=s3://bucket/runs?secret_key=abcdefgh")
    with pytest.raises(ConfigError, match=r"secret_key=\*\*\*REDACTED\*\*\*'.*under torchrun.*--target rayjob"):
        render(cfg, target)


def test_an_inline_secret_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"k8s.env.*\['HF_TOKEN'\] hold credentials.*k8s.secret_env=\[HF_TOKEN\]"):
        load_config(GSM8K, ["k8s.env={HF_TOKEN: hf_abcdefgh}"])
    with pytest.raises(ConfigError, match=r"secret_env lists \['HF_TOKEN'\] but secret_name is unset"):
        load_config(GSM8K, ["k8s.secret_env=[HF_TOKEN]"])


def test_workers_that_do_not_divide_into_pods_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"k8s.workers_per_pod=3 does not divide scaling.num_workers=4"):
        render(cluster_config("k8s.workers_per_pod=3"), "rayjob")


def test_kubeflow_targets_run_train_only() -> None:
    job = render(cluster_config(), "pytorchjob")[-1]  # the default command (run) is the RayJob's
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][3] == "train"
    with pytest.raises(ConfigError, match=r"k8s.command='sdg': the Kubeflow targets run `rayft train`"):
        render(cluster_config("k8s.command=sdg"), "pytorchjob")


def test_autoscaling_bounds_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"min_workers \(5\) is above max_workers \(2\)"):
        load_config(GSM8K, ["k8s.autoscaling.min_workers=5", "k8s.autoscaling.max_workers=2"])
    with pytest.raises(ConfigError, match=r"min_workers=5 is above the 4 worker pods"):
        render(cluster_config("k8s.autoscaling.min_workers=5"), "raycluster")


# --- the command --------------------------------------------------------------------------------------


def test_cli_prints_the_manifests_and_writes_them(tmp_path: Path) -> None:
    args = ["k8s", "render", str(GSM8K), *CLUSTER, "--image", "reg.io/rayft:2", "--namespace", "team-a"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    manifests = list(yaml.safe_load_all(result.output))
    assert [m["kind"] for m in manifests] == ["ConfigMap", "PersistentVolumeClaim", "RayJob"]
    assert {m["metadata"]["namespace"] for m in manifests} == {"team-a"}
    assert "image: reg.io/rayft:2" in result.output
    validate_all(manifests)
    result = CliRunner().invoke(cli, [*args, "--target", "raycluster", "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["00-configmap-gsm8k-granite-2b-config.yaml", "01-persistentvolumeclaim-rayft-runs.yaml",
                     "02-raycluster-gsm8k-granite-2b.yaml"]  # fmt: skip


def test_cli_names_the_fix_on_bad_input() -> None:
    result = CliRunner().invoke(cli, ["k8s", "render", str(GSM8K), *CLUSTER, "scaling.resources_per_worker={GPU: 1.5}"])
    assert result.exit_code == 2
    assert "Error: scaling.resources_per_worker.GPU=1.5" in result.output


def test_a_rayjob_can_run_a_sweep() -> None:
    rayjob = by_kind(render(cluster_config("k8s.command=tune"), "rayjob"), "RayJob")
    assert rayjob["spec"]["entrypoint"].split()[:2] == ["rayft", "tune"]


def test_rayservice_serves_the_sources_of_its_config_on_a_cluster_sized_from_serve() -> None:
    import yaml

    from rayft.serving.deployed import IMPORT_PATH, build_app

    service = by_kind(
        render(cluster_config("serve.min_replicas=1", "serve.max_replicas=3"), "rayservice"), "RayService"
    )
    validate(service)
    app = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]
    assert (app["import_path"], app["args"]) == (IMPORT_PATH, {"config": "/etc/rayft/config.yaml"})
    assert callable(build_app) and f"{build_app.__module__}:{build_app.__name__}" == IMPORT_PATH
    cluster = service["spec"]["rayClusterConfig"]
    workers = cluster["workerGroupSpecs"][0]
    assert (workers["minReplicas"], workers["maxReplicas"], cluster["enableInTreeAutoscaling"]) == (1, 3, True)
    with pytest.raises(ConfigError, match="serve.sources is empty"):
        render(cluster_config("serve.sources=[]"), "rayservice")


def test_rayservice_takes_the_api_keys_from_a_secret_by_reference() -> None:
    service = by_kind(render(cluster_config("serve.api_keys_secret=serve-keys"), "rayservice"), "RayService")
    validate(service)
    cluster = service["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for container in (c for group in groups for c in group["template"]["spec"]["containers"]):
        (entry,) = [e for e in container["env"] if e["name"] == "RAYFT_API_KEYS"]
        assert entry == {
            "name": "RAYFT_API_KEYS",
            "valueFrom": {"secretKeyRef": {"name": "serve-keys", "key": "RAYFT_API_KEYS"}},
        }
    plain = by_kind(render(cluster_config(), "rayservice"), "RayService")
    assert "RAYFT_API_KEYS" not in json.dumps(plain)
